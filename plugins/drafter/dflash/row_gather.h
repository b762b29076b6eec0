// The rows of every grouped attention call, gathered from one tensor at once.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace dflash::drafter {

// out[i] = rows.index_select(0, index[i]) for each call i, as one autograd
// node. Its backward writes every call's gradient into a single [R, ...]
// tensor, call after call: index_copy_ where the calls' rows are `disjoint`
// (the queries: the groups partition them), index_add_ otherwise (keys and
// values: groups share context rows). Autograd's own index_select backward
// gives each call a zero gradient of the whole [R, ...] and then sums them;
// at 16 calls a layer that moved about 20 GB a layer at the 3072 / 1024 × 32
// shape (docs/performance.md). The order of the additions is the calls'
// order, so the result is the same on every run.
std::vector<at::Tensor> gather_rows(const at::Tensor& rows, const std::vector<at::Tensor>& index, bool disjoint);

}  // namespace dflash::drafter
