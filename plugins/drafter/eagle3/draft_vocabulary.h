#pragma once
// EAGLE-3's draft vocabulary: the `size` target tokens seen most often among
// the training data's supervised tokens, in ascending id order (SpecForge's
// and EAGLE's rule; ties go to the lower id, and when fewer than `size`
// tokens were seen the rest are the lowest unseen ids). The drafter's head
// scores these tokens only; vLLM and SGLang map its choice back through d2t.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dflash::eagle3 {

struct DraftVocabulary {
  at::Tensor draft_to_target;  // [V_d] int64, ascending target ids
  at::Tensor target_to_draft;  // [V] int64, −1 for a token outside the draft vocabulary

  int64_t size() const { return draft_to_target.size(0); }
  // The exported maps, as vLLM and SGLang read them: d2t [V_d] int64 holds
  // target id − draft id (target = draft + d2t[draft]); t2d [V] bool marks
  // the target tokens that have a draft id.
  at::Tensor d2t() const;
  at::Tensor t2d() const;
};

// Refuses a draft vocabulary of `size` tokens over a target vocabulary of
// `vocab` unless 1 <= size <= vocab (std::invalid_argument naming both):
// one check for planning and for building it.
void check_draft_vocab_size(int64_t size, int64_t vocab);

// counts [V]: how often each target token is supervised in the training
// data (any integer dtype). Refuses a size outside [1, V], naming both.
DraftVocabulary draft_vocabulary_from_counts(const at::Tensor& counts, int64_t size);
// The inverse of d2t(): the vocabulary an exported d2t describes, over a
// target vocabulary of `target_vocab` tokens (refused when its ids are not
// ascending or fall outside it).
DraftVocabulary draft_vocabulary_from_d2t(const at::Tensor& d2t, int64_t target_vocab);

}  // namespace dflash::eagle3
