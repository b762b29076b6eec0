// The chunked gated delta rule's CUDA kernels (gated_delta_rule.h) on
// LibTorch tensors, for the hf_hybrid target's linear-attention layers.
//
// The kernels take packed rows cut into chunks that never cross a document;
// plan_delta_chunks lists them (on the host, from the rows' document starts)
// and is built once per forward, since every linear layer of the forward
// shares it. Against a build without the kernels, delta_rule_fits is false
// and chunked_gated_delta_rule throws: the caller runs its ATen path.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dflash::kernel_ops {

// Tokens a chunk (the kernels' fixed chunk) and the largest head dims they take.
constexpr int64_t kDeltaRuleChunk = 64;
constexpr int64_t kDeltaRuleMaxHeadDim = 128;

struct DeltaChunkPlan {
  // Host copies (int32 [n, 4]: row, start, length, 0 | row, first chunk,
  // chunk count, flags), and the same tables on the kernels' device.
  std::vector<int32_t> chunks, sequences;
  at::Tensor device_chunks, device_sequences;
  int64_t rows = 0, seq_len = 0;
  int64_t chunk_count() const { return static_cast<int64_t>(chunks.size()) / 4; }
  int64_t sequence_count() const { return static_cast<int64_t>(sequences.size()) / 4; }
};

// resets [rows, seq_len] bool (true where a document starts; undefined: none)
// → every row's documents as 64-token chunks. A row's tokens before its
// first reset continue the row's initial state; each row's last document
// gives its final state. The tables go to `device` (undefined: stay on the host).
DeltaChunkPlan plan_delta_chunks(const at::Tensor& resets, int64_t rows, int64_t seq_len,
                                 const c10::optional<c10::Device>& device);

// Whether the kernels take this layer: a build with them, activations (`like`)
// CUDA bf16/fp16, dk and dv ≤ 128, value heads a multiple of the key heads.
bool delta_rule_fits(const at::Tensor& like, int64_t key_heads, int64_t value_heads, int64_t dk, int64_t dv);

struct DeltaRuleResult {
  at::Tensor out;    // [B, S, Hv, dv] in v's dtype
  at::Tensor state;  // [B, Hv, dk, dv] fp32, the state after each row's last token
};
// q, k [B, S, Hk, dk] and v [B, S, Hv, dv] of v's dtype, last dim contiguous
// (e.g. views into the conv output), not yet normalised; g [B, S, Hv] fp32
// log decay; beta [B, S, Hv]; initial [B, Hv, dk, dv] fp32 or undefined.
// The plan must be plan_delta_chunks of the same rows, on v's device.
DeltaRuleResult chunked_gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial,
                                         const DeltaChunkPlan& plan);

// The recurrent form (decoding steps), the same inputs, every row continuing
// `initial` over all its tokens; fp32 inside, and row- and cut-invariant
// bitwise (gated_delta_rule.h).
DeltaRuleResult recurrent_gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial);

}  // namespace dflash::kernel_ops
