// Where the DFlash drafter's blocks sit in a packed batch: anchor sampling,
// the block slots' tokens, positions and targets, and the attention mask.
// Plain index arithmetic on the CPU (the batch arrives there), separate from
// the model so the tests can check it against slow references.
#pragma once

#include <block_attention.h>  // the block kernel's BlockKeys and KeyTile (plugins/shared/cuda_kernels)

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace dflash::drafter {

// Positions p where an anchor may start: loss_mask[p] and loss_mask[p + 1]
// are both 1 and p + 1 is in the same document as p.
std::vector<int64_t> anchor_candidates(const int64_t* loss_mask, const int64_t* documents, int64_t length);

// Up to max_anchors distinct candidates per row, chosen uniformly without
// replacement by a portable generator fixed by (seed, row), ascending.
// Returns [B, A] int64 with A = the most any row got, −1 where a row has fewer.
at::Tensor sample_anchors(const at::Tensor& loss_mask, const at::Tensor& documents, int64_t max_anchors, uint64_t seed);

struct BlockLayout {
  int64_t block_size = 0, anchors = 0;  // A anchors per row (some may be −1: padding)
  at::Tensor anchor;        // [B, A] position of each anchor, −1 = no block
  at::Tensor slot_ids;      // [B, A·Bs] token fed to each slot: the anchor token at slot 0, MASK after
  at::Tensor slot_positions;// [B, A·Bs] rotary position: the anchor's position id + k
  at::Tensor targets;       // [B, A·Bs] token slot k predicts (at anchor + k), −100 where none / unsupervised / slot 0
  at::Tensor teacher_index; // [B, A·Bs] position whose target hidden state predicts that token (anchor + k − 1), 0 if none
  at::Tensor block_valid;   // [B, A·Bs] bool: the slot belongs to a real anchor
};

// Slot k of the block at anchor a predicts the token at a + k; a target exists
// only when a + k lies in a's document and is supervised.
BlockLayout layout_blocks(const at::Tensor& input_ids, const at::Tensor& position_ids, const at::Tensor& documents,
                          const at::Tensor& loss_mask, const at::Tensor& anchors, int64_t block_size,
                          int64_t mask_token_id);

// The attention mask over keys [context S | blocks A·Bs]: a block's queries see
// the context strictly before their anchor within its document, and their own
// block in both directions; blocks never see each other; padding blocks see
// only themselves (their rows are dropped later). [B, A·Bs, S + A·Bs] bool.
at::Tensor block_attention_mask(const at::Tensor& anchors, const at::Tensor& documents, int64_t block_size);

// The same attention pattern, cut so that a kernel taking an additive mask
// does not compute (nearly) every masked pair: each row's blocks, in anchor
// order, in groups of `group_blocks`. A group's queries (its blocks' slots)
// attend to one contiguous context range [context_begin, context_end) — from
// the start of the earliest anchor's document to the latest anchor — and to
// the group's own slots, under stacked_group_attention_masks. Every key a query may see
// lies in its group's range, so nothing is lost; the masked pairs still
// computed are the spread of the group's anchors and its other blocks' slots.
// Small groups waste less and give the kernel less work per call.
//
// key_multiple > 1 widens every range to a multiple of that many positions
// (or to the whole row, whichever is shorter), earlier first: the extra keys
// are masked, and the calls then come in few distinct shapes. Fused kernels
// (cuDNN's) build an execution plan per shape; with exact ranges nearly every
// group of every step is a new shape and planning dominates the step.
struct AttentionGroup {
  int64_t row = 0, first_block = 0, blocks = 0, context_begin = 0, context_end = 0;
  int64_t queries(int64_t block_size) const { return blocks * block_size; }
  int64_t keys(int64_t block_size) const { return context_end - context_begin + blocks * block_size; }
};
// anchors [B, A] as sample_anchors gives them (ascending, −1 after the real ones).
std::vector<AttentionGroup> attention_groups(const at::Tensor& anchors, const at::Tensor& documents, int64_t group_blocks,
                                             int64_t key_multiple = 1);
// Each group's part of block_attention_mask, for groups of one shape (equal
// queries and context lengths), stacked: [groups, queries, keys] bool. A
// group's part is its queries' rows, and the columns of its context range
// then of its own slots. Computed on the device of `anchors` and `documents`,
// in a handful of operations for all the groups.
at::Tensor stacked_group_attention_masks(const std::vector<AttentionGroup>& groups, const at::Tensor& anchors,
                                         const at::Tensor& documents, int64_t block_size);

// The same attention pattern for the block kernel (drafter.attention
// "blocks"; block_attention.h), in two parts whose key sets are disjoint and
// together exactly the allowed ones, merged by log-sum-exp:
//  - prefix calls, one per group: up to group_blocks consecutive real blocks
//    of one document, all of whose queries see the document's context from
//    its start up to the group's earliest anchor. The call covers that
//    prefix, cut down to a multiple of key_multiple keys (so the calls come
//    in few shapes: cuDNN plans each new shape once), with no mask at all.
//  - block entries (16 query rows each; a block of 32 slots is two): the
//    context after the group's prefix up to the block's own anchor, then its
//    slots; padding blocks only their slots. Key tiles for the kernel's
//    backward, each listing the entries that see it.
// Rows and keys are flat indices into the layer's q rows [B·A·Bs] and k/v
// rows [B·(S + A·Bs)].
struct PrefixCall {
  int64_t query_row = 0, queries = 0, key_row = 0, keys = 0;
};
// PrefixCall's fields as the columns of block_kernel_tables' prefixes.
enum PrefixColumn : int64_t { kPrefixQueryRow, kPrefixQueries, kPrefixKeyRow, kPrefixKeys, kPrefixColumns };
struct BlockKernelLayout {
  std::vector<PrefixCall> prefixes;
  std::vector<cuda_kernels::BlockKeys> blocks;
  std::vector<cuda_kernels::KeyTile> tiles;
};
// anchors [B, A] as sample_anchors gives them; block_size a multiple of 16.
BlockKernelLayout block_kernel_layout(const at::Tensor& anchors, const at::Tensor& documents, int64_t block_size,
                                      int64_t group_blocks, int64_t key_multiple);
// The layout as prefix_block_attention takes it: prefixes CPU int64 [n, 4]
// (PrefixCall's fields); blocks [m, 6] and tiles [t, 4] (int64, the kernel's
// structs' bytes) uploaded to `device` without waiting for it.
struct BlockKernelTables {
  at::Tensor prefixes, blocks, tiles;
};
BlockKernelTables block_kernel_tables(const BlockKernelLayout& layout, const c10::Device& device);

// The slot weights w_k = exp(−(k − 1)/γ) for k ≥ 1, w_0 = 0. [block_size] float.
at::Tensor slot_weights(int64_t block_size, double gamma);

}  // namespace dflash::drafter
