#pragma once
// EAGLE-3's training-time-test attention, memory-bounded: step k's query at
// position i attends to step 0's keys of its document up to i, and to its own
// position's keys of steps 1 … k (SpecForge's rule; eagle3_model.h). Written
// out as one [S, S] score matrix per head, step 0's scores alone would be
// B·heads·S² floats — 8 GiB at 32 heads and 8,192 tokens — and autograd would
// keep one per unrolled step.
//
// Here queries go in chunks of rows whose scores fit `score_bytes`: a chunk
// [r0, r1) scores only keys [0, r1) (nothing later is visible), takes its
// softmax over those and the step's own-position keys at once (so no merge
// across chunks is needed), and keeps nothing but the output and each row's
// log-sum-exp. The backward recomputes each chunk's probabilities from them
// (flash attention's recomputation, on ATen operations), so neither pass
// holds more than one chunk's scores.
//
// The rounding follows the dense form it replaces: scores as q·kᵀ in the
// inputs' dtype, scaled, then fp32; the softmax in fp32, rounded back to the
// inputs' dtype before the weighted sum of values. Gradients are formed in
// fp32 and rounded once to each input's dtype.
#include <ATen/core/Tensor.h>
#include <ATen/core/ATen_fwd.h>

#include <cstdint>

namespace dflash::eagle3 {

// q [B, heads, S, d]; key0, value0 [B, kv_heads, S, d] (step 0's, kv head h
// serving query heads h·g … h·g + g − 1, g = heads / kv_heads);
// own_keys[j], own_values[j] [B, kv_heads, S, d] for steps 1 … k (empty at
// step 0); documents [B, S] int64, each document a contiguous run. Returns
// [B, heads, S, d] in q's dtype; differentiable in every tensor but documents.
// The fp32 scores a chunk may hold by default (the memory planner counts them).
constexpr int64_t kTttScoreBytes = int64_t{64} << 20;

at::Tensor ttt_attention(const at::Tensor& q, const at::Tensor& key0, const at::Tensor& value0, at::TensorList own_keys,
                         at::TensorList own_values, const at::Tensor& documents, double scale,
                         int64_t score_bytes = kTttScoreBytes);

// The rows a chunk takes under score_bytes (at least 1, at most S).
int64_t ttt_attention_chunk_rows(int64_t batch, int64_t heads, int64_t length, int64_t score_bytes);

}  // namespace dflash::eagle3
