#include "ttt_layout.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace dflash::eagle3 {

namespace {

// t shifted left by m along the rows: out[:, i] = t[:, i+m], `fill` past the end.
at::Tensor shifted(const at::Tensor& t, int64_t m, int64_t fill) {
  const int64_t length = t.size(1);
  at::Tensor out = at::full_like(t, fill);
  if (m < length) out.narrow(1, 0, length - m).copy_(t.narrow(1, m, length - m));
  return out;
}

// Whether position i + m exists and lies in position i's document.
at::Tensor same_document_ahead(const at::Tensor& documents, int64_t m) {
  const int64_t length = documents.size(1);
  at::Tensor out = at::zeros(documents.sizes(), documents.options().dtype(at::kBool));
  if (m < length)
    out.narrow(1, 0, length - m).copy_(documents.narrow(1, m, length - m).eq(documents.narrow(1, 0, length - m)));
  return out;
}

}  // namespace

TttLayout layout_ttt(const at::Tensor& input_ids, const at::Tensor& position_ids, const at::Tensor& documents,
                     const at::Tensor& loss_mask, int64_t steps) {
  if (steps < 1) throw std::invalid_argument("eagle3: ttt_steps is " + std::to_string(steps) + "; it must be at least 1");
  if (input_ids.dim() != 2 || !position_ids.sizes().equals(input_ids.sizes()) || !documents.sizes().equals(input_ids.sizes()) ||
      !loss_mask.sizes().equals(input_ids.sizes()))
    throw std::invalid_argument("eagle3: input_ids, position_ids, documents and loss_mask must all be [B, S]");
  const at::Tensor ids = input_ids.to(at::kLong), docs = documents.to(at::kLong), mask = loss_mask.to(at::kLong);
  const int64_t rows = ids.size(0), length = ids.size(1);
  const at::Tensor index = at::arange(length, at::kLong).expand({rows, length});
  std::vector<at::Tensor> tokens, positions, active, targets, teacher;
  for (int64_t k = 0; k < steps; ++k) {
    const at::Tensor live = same_document_ahead(docs, 1 + k);
    const at::Tensor supervised =
        live.logical_and(same_document_ahead(docs, 2 + k)).logical_and(shifted(mask, 2 + k, 0).ne(0));
    tokens.push_back(at::where(live, shifted(ids, 1 + k, 0), at::zeros_like(ids)));
    positions.push_back(position_ids.to(at::kLong) + k);
    active.push_back(live);
    targets.push_back(at::where(supervised, shifted(ids, 2 + k, 0), at::full_like(ids, -100)));
    teacher.push_back((index + 1 + k).clamp_max(length - 1));
  }
  TttLayout layout;
  layout.steps = steps;
  layout.tokens = at::stack(tokens);
  layout.positions = at::stack(positions);
  layout.active = at::stack(active);
  layout.targets = at::stack(targets);
  layout.teacher_index = at::stack(teacher);
  return layout;
}

}  // namespace dflash::eagle3
