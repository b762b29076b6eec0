// The arithmetic of a Gated DeltaNet layer (Qwen3.5 / Qwen3.6 "linear
// attention"), without its projections: the causal depthwise convolution and
// the gated delta rule, over packed rows whose documents must not see each
// other, and over decoding sessions that carry their state from one step to
// the next.
//
// Per value head h and token t (state S [dk, dv], fp32):
//   S ← exp(g_t) · S                       (S ← 0 first where a document starts)
//   S ← S + k_t ⊗ β_t (v_t − Sᵀ k_t)       (the delta rule)
//   o_t = Sᵀ q_t
// with q, k L2-normalised per head, q scaled by dk^-½, and each key head
// serving value_heads / key_heads consecutive value heads — as transformers'
// torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule compute it.
#pragma once

#include <delta_rule_ops.h>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dflash::target::gdn {

// Where each token's state restarts: resets [B, S] bool, true at the first
// token of a document (the state and the convolution's window are empty
// there). Undefined: no restart inside the rows (each row continues the
// state it is given, or starts from zero).
//
// x [B, S, C] (the in_proj_qkv output), weight [C, K]. prefix [B, K-1, C]:
// the inputs just before each row (a decoding session's window), undefined
// for zeros. Returns SiLU(conv(x)) [B, S, C] in x's dtype, the taps summed in
// fp32 and rounded once, as cuDNN's / ATen's conv1d does.
at::Tensor causal_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& resets,
                       const at::Tensor& prefix);

struct DeltaOutput {
  at::Tensor out;    // [B, S, Hv, dv] in v's dtype
  at::Tensor state;  // [B, Hv, dk, dv] fp32: the state after each row's last token
};

// The chunked form (prefill): chunks of `chunk` tokens (a power of two), the
// UT transform's inverse inside a chunk, one sequential step per chunk. q, k
// [B, S, Hk, dk]; v [B, S, Hv, dv]; g [B, S, Hv] (log decay, ≤ 0, fp32);
// beta [B, S, Hv]; initial [B, Hv, dk, dv] fp32 or undefined (zeros).
//
// Where the CUDA kernels take the layer (kernel_ops::delta_rule_fits: bf16 /
// fp16 on CUDA, 64-token chunks) they run it, over `plan` — the rows'
// documents as chunks, plan_delta_chunks(resets, ...) on v's device, built
// once a forward (it reads resets on the host); null: built here. Elsewhere
// (the CPU, fp32, or `reference`) the ATen form below runs, in fp32.
DeltaOutput chunked_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                               const at::Tensor& beta, const at::Tensor& resets, const at::Tensor& initial,
                               int64_t chunk = 64, const kernel_ops::DeltaChunkPlan* plan = nullptr,
                               bool reference = false);

// Whether chunked_delta_rule runs the CUDA kernels for these activations.
bool kernels_take(const at::Tensor& like, int64_t key_heads, int64_t value_heads, int64_t dk, int64_t dv,
                  int64_t chunk = 64);

// The recurrent form (decoding steps): token by token, no resets. Each
// token's state depends only on the state before it and its own inputs, so
// replaying a step's first t tokens from the state before the step gives the
// state the step had after token t (the same operations; bitwise on the
// CPU, where a reduction does not split by the batch's shape, and in the
// CUDA kernel, whose sums have a fixed order): a session is cut back that
// way (hybrid_model.cpp), keeping a step's inputs, not its states. Where the
// kernels take the layer (bf16 / fp16 on CUDA) one kernel runs the whole
// step (kernel_ops::recurrent_gated_delta_rule, fp32 inside); `reference`
// or elsewhere, the ATen loop below.
DeltaOutput recurrent_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                 const at::Tensor& beta, const at::Tensor& initial, bool reference = false);

}  // namespace dflash::target::gdn
