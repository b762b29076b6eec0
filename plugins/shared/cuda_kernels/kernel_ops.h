// The CUDA kernels of cuda_kernels.h on LibTorch tensors: what the hf_decoder
// target's GPU path and the dflash drafter's fused decoding call. Each call
// runs on the current CUDA stream of its input's device, allocates only its
// outputs and never waits for the device, so it can be captured in a CUDA graph.
//
// Against a CPU LibTorch (DFLASH_CUDA_KERNELS 0) available() is false and
// every other call throws: callers keep their ATen reference path, which is
// also what the kernels are tested against.
#pragma once

#include "attention_tiling.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dflash::kernel_ops {

// Whether this build carries the kernels (a CUDA LibTorch and a CUDA compiler).
bool available();

// Whether the kernels take these activations: a CUDA tensor of bf16 or fp16
// (and a build that has them).
bool runs_on(const at::Tensor& like);

// x [..., width] → weight ⊙ RMSNorm(x), Hugging Face's rounding; the same shape as x,
// written into `out` when given (contiguous, x's shape and dtype: e.g. rows of a larger buffer).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& out = {});

struct HeadTensors {
  at::Tensor q, k, v;  // [tokens, heads, head_dim], [tokens, kv_heads, head_dim] ×2, contiguous
};

// The fused projection's output [tokens, (heads + 2·kv_heads)·head_dim] → q and k
// with the optional per-head RMSNorm (undefined weights: none) and the rotary
// embedding (cos/sin: contiguous fp32 [tokens, head_dim/2], row t for token t),
// and v. heads = 0 takes a [k; v] projection (q is then empty).
HeadTensors qk_norm_rope(const at::Tensor& qkv, const at::Tensor& q_norm, const at::Tensor& k_norm,
                         const at::Tensor& cos, const at::Tensor& sin, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, double eps);

// qk_norm_rope for decoding into a KV cache, in one kernel: token t rotates
// by row positions[t] of the full tables cos_table/sin_table (fp32
// [positions, head_dim/2]) and its k and v are written to row slots[t] of
// keys/values (contiguous [rows, kv_heads, head_dim]); positions and slots
// are int64 [tokens] on the device (no gather of the tables, no index_copy).
// Returns q [tokens, heads, head_dim]. The arithmetic is qk_norm_rope's.
at::Tensor qk_norm_rope_into_cache(const at::Tensor& qkv, const at::Tensor& q_norm, const at::Tensor& k_norm,
                                   const at::Tensor& cos_table, const at::Tensor& sin_table, const at::Tensor& positions,
                                   const at::Tensor& keys, const at::Tensor& values, const at::Tensor& slots, int64_t heads,
                                   int64_t kv_heads, int64_t head_dim, double eps);

// gate_up [rows, 2·width] → silu(gate) ⊙ up [rows, width].
at::Tensor swiglu(const at::Tensor& gate_up);

// x [..., width] → round(x̂ · scale), scale the fp32 (1 + w) [width] of a
// Qwen3.5 RMSNorm; x's shape and dtype.
at::Tensor rms_norm_scaled(const at::Tensor& x, const at::Tensor& scale, double eps);
// Gated DeltaNet's output norm: x [tokens, heads, width] and gate [tokens,
// heads·width] (its rows may be strided: a view into the projection; the
// last dimension contiguous), weight [width] → [tokens, heads·width].
at::Tensor gated_rms_norm(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& weight, double eps);
// Gated DeltaNet's causal conv1d + SiLU: x [B, S, C] (the last dimension
// contiguous; e.g. a view into the projection), weight [C, K], prefix
// [B, K−1, C] or undefined (zeros), in_document [B, S] (each token's index
// in its document, any integer type) or undefined → [B, S, C] contiguous.
at::Tensor causal_conv_silu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& prefix,
                            const at::Tensor& in_document);

// A draft tree's accepted path kept in every cache at once: in each tensor of
// `caches` (CUDA, contiguous, any dtype; viewed as rows of row_numel
// elements), row to_start + j ← row from[j] for each j, in launches of up to
// 64 caches and 256 moves (no upload, no wait). Throws std::invalid_argument
// unless the sources increase and from[j] ≥ to_start + j (a path's nodes,
// stored parents first after to_start) and stay inside every cache.
void move_cache_rows_(const std::vector<at::Tensor>& caches, int64_t row_numel, const std::vector<int64_t>& from,
                      int64_t to_start);

// ---- Training (the dflash drafter's layers; trainable_ops.h wraps them in
// autograd): forwards that also return what their backward needs, and the
// backwards. Inputs are made contiguous; weights are the activations' dtype.
struct NormForward {
  at::Tensor out;   // like x
  at::Tensor rstd;  // fp32, one per normalised vector: [rows] or [tokens, heads]
};
struct NormBackward {
  at::Tensor dx, dweight;
};
// rms_norm, and each row's rsqrt(mean(x²) + eps).
NormForward rms_norm_with_rstd(const at::Tensor& x, const at::Tensor& weight, double eps);
NormBackward rms_norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& rstd);
// x [tokens, heads, head_dim] → the per-head RMSNorm (weight [head_dim]) then
// the rotary embedding (cos/sin fp32 [tokens, head_dim/2], row t for token t),
// qk_norm_rope's arithmetic; rstd [tokens, heads].
NormForward head_norm_rope(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                           double eps);
NormBackward head_norm_rope_backward(const at::Tensor& dout, const at::Tensor& x, const at::Tensor& weight,
                                     const at::Tensor& rstd, const at::Tensor& cos, const at::Tensor& sin);
// gate_up [rows, 2·width], d_out [rows, width] → d_gate_up [rows, 2·width].
at::Tensor swiglu_backward(const at::Tensor& gate_up, const at::Tensor& d_out);

// Exact decoding's row-invariant kernels (cuda_kernels.h says why): a row's
// result is bitwise the same whether it is computed alone or among other
// rows. A chain step takes them up to kInvariantMaxRows tokens (a drafted
// block); a draft tree's nodes, any number (the linear runs 16-row tiles).
constexpr int64_t kInvariantMaxRows = 16;

// Which products invariant_linear runs on `on`'s device: the warpgroup MMA
// (a build for sm_90a on a compute-capability 9.0 GPU) or mma.sync; and
// whether the device's code of the kernels holds the warpgroup MMA at all
// (asked of the device: a one-thread kernel, waited for). The two agree on
// a 9.0 GPU; a build whose flag missed its sm_90a code would run mma.sync.
struct InvariantLinearProducts {
  bool wgmma = false;
  bool wgmma_in_device_code = false;
  int compute_capability = 0;  // the device's, major · 10 + minor
  const char* name() const { return wgmma ? "warpgroup MMA (sm_90a)" : "mma.sync"; }
};
InvariantLinearProducts invariant_linear_products(const at::Tensor& on);
// Whether invariant_linear takes x [rows, in] and weight [out, in]: CUDA
// bf16/fp16, in a multiple of 8.
bool invariant_linear_fits(const at::Tensor& x, const at::Tensor& weight);
// Whether invariant_linear of x and weight adds its runs of k in a cluster of
// its blocks (no workspace), on x's device; never a row's bits.
bool invariant_linear_adds_runs_in_cluster(const at::Tensor& x, const at::Tensor& weight);
// The most runs of k a cluster adds, for the process (cuda_kernels.h).
void set_invariant_linear_most_cluster_runs(int most);
// Warpgroups a block of the warpgroup products has, for the process (cuda_kernels.h).
void set_invariant_linear_warpgroups(int warpgroups);
// x [rows, in] · weightᵀ (+ bias [out]) (+ residual [rows, out]) → [rows, out],
// summed in fp32 and rounded once (as cuBLAS's epilogue rounds).
at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {},
                            const at::Tensor& residual = {});
// x [..., in] · weightᵀ (+ bias): invariant_linear where `invariant` (any
// leading shape; x copied first where the kernel cannot read it in place),
// else at::linear — the one switch of exact decoding's projections.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, bool invariant);
// residual += a · weightᵀ, in place (residual contiguous [rows, out]).
void invariant_add_linear_(at::Tensor& residual, const at::Tensor& a, const at::Tensor& weight);

// Decoding attention over the pool (the arguments of the hf_decoder's
// fast_path::decode_attention, which it replaces in exact decoding), one
// query at a time. Returns [tokens, heads·head_dim]. A draft tree (one
// session, n nodes): tree_rows int32 [n, depth] holds each node's path from
// the root, itself last, as rows of the session, tree_lengths int32 [n] its
// length; the node sees the session's keys before the step, then its path.
// `tiling` caps how many queries a block takes (never a query's bits).
at::Tensor invariant_decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                      const at::Tensor& cu_k, const at::Tensor& seqused_k, int64_t n, int64_t capacity,
                                      const at::Tensor& tree_rows = {}, const at::Tensor& tree_lengths = {},
                                      const cuda_kernels::AttentionTiling& tiling = {});
// Whether it takes this head_dim and sessions of up to `capacity` tokens.
bool invariant_decode_attention_fits(int64_t head_dim, int64_t capacity);

// ---- Block attention (block_attention.h): the dflash drafter's training
// attention without a mask tensor. q/k/v rows [R, heads or kv_heads, d]
// (made contiguous); blocks: device int64 [n, kBlockKeysFields] laid out as
// BlockKeys; tiles: device int64 [m, kKeyTileInt64s] laid out as KeyTile.
// Whether the kernels take this shape: a build with them, CUDA bf16, and
// block_kernel_shape_fits (block_attention.h: the one statement of the rule).
bool block_attention_fits(const at::Tensor& like, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size);
struct BlockAttentionForward {
  at::Tensor out;  // like q
  at::Tensor lse;  // fp32 [Rq, heads], natural log
};
// prior_out/prior_lse (optional; like out/lse): merged in (block_attention.h).
BlockAttentionForward block_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& blocks, const at::Tensor& prior_out,
                                              const at::Tensor& prior_lse, double scale);
struct BlockAttentionGrads {
  at::Tensor dq, dk, dv;
};
BlockAttentionGrads block_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
                                             const at::Tensor& blocks, const at::Tensor& tiles, double scale);

}  // namespace dflash::kernel_ops
