// The chunked gated delta rule (Gated DeltaNet's linear attention, Qwen3.5 /
// Qwen3.6) on CUDA: two kernels instead of the ~40 ATen passes over fp32
// [B, H, S, d] temporaries of the reference path (hf_hybrid's
// gated_deltanet.cpp, which states the recurrence).
//
//   prepare (one block per chunk and value head, all in parallel): q and k
//     L2-normalised, the in-chunk cumulative log decay, A = β K Kᵀ ⊙ decay
//     (strictly lower), T = (I + A)⁻¹ by 16 × 16 blocks, and
//     w = T (β k ⊙ exp(decay)), u = T (β v), P = (q kᵀ ⊙ decay) (lower, with
//     the diagonal) and the decays, written to a workspace, and q and k
//     normalised once per key head;
//   recurrence (one block per document, value head and 64 value columns):
//     the state [dk, 64] in the warps' fp32 accumulators, chunk after chunk:
//     v' = u − w S, o = exp(decay) ⊙ (q S) + P v',
//     S ← exp(decay_last) S + kᵀ (v' ⊙ exp(decay_last − decay)).
//
// Chunks never cross a document: a packed row's documents are cut into
// their own 64-token chunks (the host lists them), so no chunk needs the
// reference path's segment masks. Products run on the tensor cores with
// bf16 / fp16 operands and fp32 accumulation — the precision of
// flash-linear-attention's kernels, which transformers itself calls when it
// is installed; the state is carried in fp32.
//
// Free of LibTorch types; delta_rule_ops.h wraps it for tensors.
#pragma once

#include "cuda_kernels.h"

#include <cstdint>

namespace dflash::cuda_kernels {

constexpr int64_t kDeltaChunk = 64;          // tokens a chunk
constexpr int64_t kDeltaMaxHeadDim = 128;    // dk and dv each at most this

// Up to 64 tokens of one document: tokens [start, start + length) of `row`.
struct DeltaChunk {
  int32_t row = 0, start = 0, length = 0, unused = 0;
};
// A document (or a row's first tokens, continuing `initial`): chunks
// [first_chunk, first_chunk + chunk_count) in order, the state flowing from
// each to the next.
struct DeltaSequence {
  int32_t row = 0, first_chunk = 0, chunk_count = 0, flags = 0;
};
constexpr int32_t kSequenceFromInitial = 1;  // starts from initial[row], not zeros
constexpr int32_t kSequenceWritesFinal = 2;  // its last state is final_state[row]
constexpr int64_t kDeltaTableInts = 4;       // int32s per DeltaChunk / DeltaSequence

struct DeltaRuleArgs {
  // q, k [B, S, key_heads, dk]; v [B, S, value_heads, dv]; the last dimension
  // contiguous, the others at these strides (elements: row, token, head).
  // Value head h reads key head h / (value_heads / key_heads).
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_stride[3] = {0, 0, 0}, k_stride[3] = {0, 0, 0}, v_stride[3] = {0, 0, 0};
  const float* g = nullptr;     // [B, S, value_heads] contiguous: log decay (≤ 0)
  const float* beta = nullptr;  // [B, S, value_heads] contiguous
  const float* initial = nullptr;  // [B, value_heads, dk, dv] or null (zeros)
  void* out = nullptr;             // [B, S, value_heads, dv] contiguous, q's dtype
  float* final_state = nullptr;    // [B, value_heads, dk, dv], or null (not wanted)
  const DeltaChunk* chunks = nullptr;  // device memory
  const DeltaSequence* sequences = nullptr;
  int64_t chunk_count = 0, sequence_count = 0;
  int64_t seq_len = 0, key_heads = 0, value_heads = 0, dk = 0, dv = 0;
  void* workspace = nullptr;  // delta_rule_workspace_bytes(chunk_count, key_heads, value_heads, dk, dv)
  int64_t rows = 0;           // B (the recurrent form's grid; the chunked form reads its tables)
};

int64_t delta_rule_workspace_bytes(int64_t chunk_count, int64_t key_heads, int64_t value_heads, int64_t dk,
                                   int64_t dv);

// Runs both kernels on `stream`. Every token of every row must lie in exactly
// one chunk; rows without a sequence flagged kSequenceWritesFinal leave their
// final_state untouched.
void chunked_gated_delta_rule(Element element, const DeltaRuleArgs& args, cudaStream_t stream);

// The recurrent form, token after token (decoding steps: a few tokens a
// session): the same arguments but for the chunk tables and the workspace
// (unused); every row continues `initial` (null: zeros) over all seq_len
// tokens, and final_state gets every row's state after its last token.
// One block per (row, value head, 32 value columns); all arithmetic fp32, in
// transformers' recurrent order (decay, S ᵀk, the delta, the update, Sᵀq),
// each sum in a fixed order that depends on nothing but the head's
// dimensions: a row's result is bitwise the same whatever the other rows,
// and running a step's first t tokens, or all of them in two calls cut at
// t, gives bitwise the same state after token t (decode_truncate replays a
// step that way).
void recurrent_gated_delta_rule(Element element, const DeltaRuleArgs& args, cudaStream_t stream);

}  // namespace dflash::cuda_kernels
