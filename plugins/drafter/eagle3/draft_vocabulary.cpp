#include "draft_vocabulary.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace dflash::eagle3 {

namespace {

DraftVocabulary from_ids(const at::Tensor& ascending_ids, int64_t target_vocab) {
  DraftVocabulary v;
  v.draft_to_target = ascending_ids.to(at::kLong).contiguous();
  v.target_to_draft = at::full({target_vocab}, -1, at::kLong);
  v.target_to_draft.index_put_({v.draft_to_target}, at::arange(v.draft_to_target.size(0), at::kLong));
  return v;
}

}  // namespace

at::Tensor DraftVocabulary::d2t() const { return draft_to_target - at::arange(size(), at::kLong); }
at::Tensor DraftVocabulary::t2d() const { return target_to_draft.ge(0); }

void check_draft_vocab_size(int64_t size, int64_t vocab) {
  if (size < 1 || size > vocab)
    throw std::invalid_argument("eagle3: draft_vocab_size is " + std::to_string(size) + ", but the target's vocabulary has " +
                                std::to_string(vocab) + " tokens; a draft vocabulary holds 1 to " + std::to_string(vocab));
}

DraftVocabulary draft_vocabulary_from_counts(const at::Tensor& counts, int64_t size) {
  if (counts.dim() != 1 || at::isFloatingType(counts.scalar_type()))
    throw std::invalid_argument("eagle3: token counts must be one integer count per target token, [V]");
  const int64_t vocab = counts.size(0);
  check_draft_vocab_size(size, vocab);
  // Most frequent first, the lower id first among equals: a stable sort of
  // the ids by descending count.
  const at::Tensor c = counts.to(at::kCPU, at::kLong);
  if (c.lt(0).any().item<bool>()) throw std::invalid_argument("eagle3: token counts must not be negative");
  const at::Tensor order = std::get<1>(c.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  return from_ids(std::get<0>(order.narrow(0, 0, size).sort()), vocab);
}

DraftVocabulary draft_vocabulary_from_d2t(const at::Tensor& d2t, int64_t target_vocab) {
  if (d2t.dim() != 1 || d2t.size(0) < 1 || d2t.scalar_type() != at::kLong)
    throw std::invalid_argument("eagle3: d2t must be [V_d] int64");
  const at::Tensor ids = d2t.to(at::kCPU) + at::arange(d2t.size(0), at::kLong);
  if (ids.lt(0).any().item<bool>() || ids.ge(target_vocab).any().item<bool>())
    throw std::invalid_argument("eagle3: d2t maps a draft id outside the target's vocabulary of " + std::to_string(target_vocab));
  if (ids.size(0) > 1 && ids.narrow(0, 1, ids.size(0) - 1).le(ids.narrow(0, 0, ids.size(0) - 1)).any().item<bool>())
    throw std::invalid_argument("eagle3: d2t's target ids are not strictly ascending");
  return from_ids(ids, target_vocab);
}

}  // namespace dflash::eagle3
