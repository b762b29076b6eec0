#include "row_gather.h"

#include <torch/csrc/autograd/custom_function.h>

namespace dflash::drafter {
namespace {

class GatherRows : public torch::autograd::Function<GatherRows> {
 public:
  // `index` is not a variable (a std::vector, not a TensorList): only `rows`
  // is differentiated.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& rows,
                                                const std::vector<at::Tensor>& index, bool disjoint) {
    torch::autograd::variable_list out;
    out.reserve(index.size());
    int64_t gathered = 0;
    for (const at::Tensor& i : index) {
      out.push_back(rows.index_select(0, i));
      gathered += i.numel();
    }
    ctx->saved_data["index"] = index;
    ctx->saved_data["sizes"] = rows.sizes().vec();
    // Disjoint calls that gather as many rows as there are cover every row:
    // the gradient needs no zeroing first.
    ctx->saved_data["covers"] = disjoint && gathered == rows.size(0);
    ctx->saved_data["disjoint"] = disjoint;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<at::Tensor> index = ctx->saved_data["index"].toTensorVector();
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const bool disjoint = ctx->saved_data["disjoint"].toBool();
    const at::Tensor* first = nullptr;
    bool every_call = true;  // every call's gradient reaches here
    for (const at::Tensor& g : grads) {
      if (!g.defined()) every_call = false;
      else if (first == nullptr) first = &g;
    }
    if (first == nullptr) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const bool writes_every_row = every_call && ctx->saved_data["covers"].toBool();
    at::Tensor grad = writes_every_row ? at::empty(sizes, first->options()) : at::zeros(sizes, first->options());
    for (size_t i = 0; i < grads.size(); ++i)
      if (grads[i].defined()) put_rows(grad, index[i], {}, grads[i], /*add=*/!disjoint);
    return {grad, at::Tensor(), at::Tensor()};  // one per forward argument
  }
};

}  // namespace

at::Tensor take_rows(const at::Tensor& rows, const at::Tensor& index, const std::vector<RowRange>& ranges) {
  if (ranges.empty()) return rows.index_select(0, index);
  if (ranges.size() == 1) return rows.narrow(0, ranges[0].start, ranges[0].length);
  std::vector<at::Tensor> parts;
  parts.reserve(ranges.size());
  for (const RowRange& r : ranges) parts.push_back(rows.narrow(0, r.start, r.length));
  return at::cat(parts);
}

void put_rows(at::Tensor& into, const at::Tensor& index, const std::vector<RowRange>& ranges, const at::Tensor& values,
              bool add) {
  if (ranges.empty()) {
    if (add)
      into.index_add_(0, index, values);
    else
      into.index_copy_(0, index, values);
    return;
  }
  int64_t offset = 0;
  for (const RowRange& r : ranges) {
    at::Tensor into_range = into.narrow(0, r.start, r.length);
    const at::Tensor from = values.narrow(0, offset, r.length);
    if (add)
      into_range.add_(from);
    else
      into_range.copy_(from);
    offset += r.length;
  }
}

std::vector<at::Tensor> gather_rows(const at::Tensor& rows, const std::vector<at::Tensor>& index, bool disjoint) {
  return GatherRows::apply(rows, index, disjoint);
}

}  // namespace dflash::drafter
