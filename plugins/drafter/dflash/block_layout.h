// Where the DFlash drafter's blocks sit in a packed batch: anchor sampling,
// the block slots' tokens, positions and targets, and the attention mask.
// Plain index arithmetic on the CPU (the batch arrives there), separate from
// the model so the tests can check it against slow references.
#pragma once

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

// The same attention pattern as block_attention_mask, as variable-length
// sequences for a flash-attention kernel: block i's queries (its block_size
// slots) are one sequence, and its keys are exactly the ones it may see —
// its document's context before the anchor, then its own block — gathered
// from the flattened keys [context B·S | blocks B·Q]. No masked pair is ever
// computed, and the plan is built once per batch for every layer.
struct VarlenPlan {
  at::Tensor gather;      // [total keys] int64 rows of the flattened keys, block after block
  at::Tensor cu_queries;  // [blocks + 1] int32 query offsets (block_size apart)
  at::Tensor cu_keys;     // [blocks + 1] int32 key offsets into `gather`
  int64_t max_keys = 0;   // the longest key sequence
};
VarlenPlan varlen_plan(const at::Tensor& anchors, const at::Tensor& documents, int64_t block_size);

// The slot weights w_k = exp(−(k − 1)/γ) for k ≥ 1, w_0 = 0. [block_size] float.
at::Tensor slot_weights(int64_t block_size, double gamma);

}  // namespace dflash::drafter
