#include "packed_rows.h"

#include <ATen/ATen.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace dflash::hf {

PackedRows resolve_packed_rows(const at::Tensor& input_ids, const at::Tensor& position_ids,
                               const at::Tensor& document_ids, int64_t vocab_size, const c10::Device& device) {
  if (input_ids.dim() != 2) throw std::invalid_argument("input_ids must be [B, S], got " + c10::str(input_ids.sizes()));
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"position_ids", position_ids},
                                 {"document_ids", document_ids}})
    if (t.defined() && t.sizes() != input_ids.sizes())
      throw std::invalid_argument(std::string(name) + " must have input_ids' shape " + c10::str(input_ids.sizes()) +
                                  ", got " + c10::str(t.sizes()));
  PackedRows r;
  r.ids = input_ids.to(device, at::kLong);
  if (r.ids.numel() > 0 && (r.ids.min().item<int64_t>() < 0 || r.ids.max().item<int64_t>() >= vocab_size))
    throw std::invalid_argument("input_ids has ids outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  const int64_t b = r.ids.size(0), s = r.ids.size(1);
  if (document_ids.defined()) r.documents = document_ids.to(device, at::kLong);
  if (position_ids.defined()) r.positions = position_ids.to(device, at::kLong);
  if (!r.documents.defined() && r.positions.defined()) r.documents = r.positions.eq(0).to(at::kLong).cumsum(1);
  if (r.documents.defined() && s > 0)
    r.starts = at::cat({at::ones({b, 1}, r.ids.options().dtype(at::kBool)),
                        r.documents.narrow(1, 1, s - 1).ne(r.documents.narrow(1, 0, s - 1))}, 1);
  if (!r.positions.defined()) {
    // Position within the document: index minus the index of its first token.
    const at::Tensor index = at::arange(s, r.ids.options()).expand({b, s});
    r.positions = r.starts.defined()
                      ? index - std::get<0>(at::cummax(at::where(r.starts, index, at::zeros_like(index)), 1))
                      : index;
  }
  return r;
}

c10::optional<at::Tensor> document_causal_mask(const PackedRows& rows, const at::TensorOptions& options) {
  const at::Tensor& documents = rows.documents;
  if (!documents.defined() || documents.size(1) == 0 || documents.eq(documents.narrow(1, 0, 1)).all().item<bool>())
    return c10::nullopt;
  const int64_t s = documents.size(1);
  const at::Tensor allowed = documents.unsqueeze(2)
                                 .eq(documents.unsqueeze(1))
                                 .logical_and(at::ones({s, s}, documents.options().dtype(at::kBool)).tril())
                                 .unsqueeze(1);  // [B, 1, S, S]
  return at::zeros(allowed.sizes(), options).masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
}

}  // namespace dflash::hf
