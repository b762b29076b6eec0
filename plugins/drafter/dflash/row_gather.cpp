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
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      if (disjoint)
        grad.index_copy_(0, index[i], grads[i]);
      else
        grad.index_add_(0, index[i], grads[i]);
    }
    return {grad, at::Tensor(), at::Tensor()};  // one per forward argument
  }
};

}  // namespace

std::vector<at::Tensor> gather_rows(const at::Tensor& rows, const std::vector<at::Tensor>& index, bool disjoint) {
  return GatherRows::apply(rows, index, disjoint);
}

}  // namespace dflash::drafter
