#pragma once
// EAGLE-3's training-time test (TTT) over the host's packed rows: which token
// each position reads at each unrolled step, at which rotary position, what it
// predicts and which target position's distribution teaches it.
//
// Step k (0 ≤ k < steps) at position i of a row reads the token x[i+1+k] and,
// at step 0, the target's features at i (later steps read the drafter's own
// output of the step before, at i). It predicts x[i+2+k], taught by the
// target's distribution at i+1+k. A position is active at step k while
// i+1+k lies in its document; it is supervised while x[i+2+k] does too and
// its loss_mask is 1. Its rotary position is position_ids[i] + k.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dflash::eagle3 {

struct TttLayout {
  int64_t steps = 0;
  // [steps, B, S] int64: the token read (0 where the position is not active).
  at::Tensor tokens;
  // [steps, B, S] int64: the rotary position.
  at::Tensor positions;
  // [steps, B, S] bool: the position is a real query at this step.
  at::Tensor active;
  // [steps, B, S] int64: the token predicted, in the target's vocabulary;
  // -100 where the position is not supervised at this step.
  at::Tensor targets;
  // [steps, B, S] int64: the position within the row whose target
  // distribution teaches this one (i+1+k, clamped to the row).
  at::Tensor teacher_index;
};

// input_ids, position_ids, documents, loss_mask: [B, S] int64 on the CPU
// (documents: equal ids for the tokens of one document, each document a
// contiguous run).
TttLayout layout_ttt(const at::Tensor& input_ids, const at::Tensor& position_ids, const at::Tensor& documents,
                     const at::Tensor& loss_mask, int64_t steps);

}  // namespace dflash::eagle3
