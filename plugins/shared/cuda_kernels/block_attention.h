// Block attention for the DFlash drafter's training step on CUDA, without a
// mask tensor (block_attention.cu says how).
#pragma once

#include <cstdint>
#include <string>

struct CUstream_st;  // cudaStream_t, without the CUDA headers: the drafter includes this for the structs

namespace dflash::cuda_kernels {

// 16 query rows of one drafted block (a block of 32 slots is two entries
// with the same keys) and the keys they see. q, out [Rq, heads, 128] rows;
// k, v [Rk, kv_heads, 128] rows. The rows start at query_row; their keys are
// k rows key_row + [context_begin, context_end) (the context of the block's
// document before its anchor, or the part of it a prior call did not cover;
// empty for a padding block) and then the block's slot_count slots (16, 32,
// 48 or 64) at slot_row. Six int64s: the drafter uploads an int64 [n, 6]
// tensor as an array of these.
struct BlockKeys {
  int64_t query_row = 0, key_row = 0, context_begin = 0, context_end = 0, slot_row = 0, slot_count = 16;
};
constexpr int64_t kBlockKeysFields = 6;
constexpr int64_t kEntryRows = 16;  // query rows per entry (per head)
constexpr int64_t kMaxSlots = 64;
// The block sizes the kernels take: whole entries, one key tile of slots.
constexpr bool block_size_fits(int64_t block_size) {
  return block_size > 0 && block_size % kEntryRows == 0 && block_size <= kMaxSlots;
}
// The same rule in words, "16, 32, 48 or 64", for messages and schema
// descriptions (so the text never disagrees with the rule).
inline std::string block_sizes_in_words() {
  std::string words;
  for (int64_t size = kEntryRows; size <= kMaxSlots; size += kEntryRows)
    words += (words.empty() ? "" : size + kEntryRows > kMaxSlots ? " or " : ", ") + std::to_string(size);
  return words;
}
// The head shapes the kernels take (in bf16, on CUDA): head_dim 128, 4
// query heads per KV head. One rule for the step (kernel_ops'
// block_attention_fits) and the drafter's memory plan, which must plan the
// grouped attention a step of another shape falls back to.
constexpr bool block_kernel_shape_fits(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size) {
  return head_dim == 128 && heads == 4 * kv_heads && block_size_fits(block_size);
}

// out and lse (fp32 [Rq, heads], natural log of each row's softmax
// denominator over scale·q·k) for every entry; bf16; 4 query heads per KV
// head; head_dim 128; q, k, v rows contiguous. blocks: device memory.
//
// prior_out/prior_lse (optional, laid out as out/lse): another call's
// attention of the same rows over keys disjoint from these (the shared
// context prefix, through cuDNN). Where a row's prior_lse is finite the
// written out and lse are of the union of both key sets (merged by
// log-sum-exp); where it is −inf, prior_out is not read.
void block_attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, const void* prior_out,
                             const float* prior_lse, const BlockKeys* blocks, int64_t block_count, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, float scale, CUstream_st* stream);

// A tile of 64 key rows for the backward's key-parallel pass: k rows
// [key_row, key_row + 64), of which [lo, hi) are keys, seen by entries
// [first_block, last_block) of the BlockKeys array (entries between that see
// none of it cost time only). A context tile (position0 ≥ 0) holds context
// positions position0 + i, which entry b sees where b.context_begin ≤
// position < b.context_end; a slot tile (position0 = −1) holds one block's
// slots, all seen by that block's entries. Every key row that some entry
// sees lies in exactly one tile. 32 bytes: uploaded as int64 [n, 4].
struct KeyTile {
  int64_t key_row = 0, position0 = -1;
  int32_t lo = 0, hi = 0, first_block = 0, last_block = 0;
};
constexpr int64_t kKeyTileInt64s = 4;
constexpr int64_t kKeyTileRows = 64;

// dq, dk, dv (bf16, laid out as q, k, v) from grad_out and the forward's out
// and lse. delta: fp32 [Rq, heads] workspace. dk and dv are zeroed first
// (key_row_count rows): rows no entry sees keep zero. With a prior (the
// forward's out and lse are then the merged ones) these are the gradients
// through this call's keys alone; the prior call's backward, given the same
// merged out and lse, gives the rest.
void block_attention_backward(const void* q, const void* k, const void* v, const void* out, const void* grad_out,
                              const float* lse, float* delta, void* grad_q, void* grad_k, void* grad_v,
                              const BlockKeys* blocks, int64_t block_count, const KeyTile* tiles, int64_t tile_count,
                              int64_t query_row_count, int64_t key_row_count, int64_t heads, int64_t kv_heads,
                              int64_t head_dim, float scale, CUstream_st* stream);

}  // namespace dflash::cuda_kernels
