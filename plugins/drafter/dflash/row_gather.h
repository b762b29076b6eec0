// The rows of every grouped attention call, gathered from one tensor at once.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace dflash::drafter {

// Rows [start, start + length) of a tensor of rows.
struct RowRange {
  int64_t start = 0, length = 0;
};

// rows.index_select(0, index), or where `ranges` lists the same rows as a
// few contiguous runs (in index order), their slices: one run is a view, no
// copy.
at::Tensor take_rows(const at::Tensor& rows, const at::Tensor& index, const std::vector<RowRange>& ranges);

// values' rows into `into` at the rows take_rows takes: copied, or added
// (`add`: rows that other calls write too), by index or, where `ranges` is
// not empty, slice by slice (no atomics).
void put_rows(at::Tensor& into, const at::Tensor& index, const std::vector<RowRange>& ranges, const at::Tensor& values,
              bool add);

// out[i] = rows.index_select(0, index[i]) for each call i, as one autograd
// node. Its backward writes every call's gradient into a single [R, ...]
// tensor, call after call (put_rows): copied where the calls' rows are `disjoint`
// (the queries: the groups partition them), added otherwise (keys and
// values: groups share context rows). Autograd's own index_select backward
// gives each call a zero gradient of the whole [R, ...] and then sums them;
// at 16 calls a layer that moved about 20 GB a layer at the 3072 / 1024 × 32
// shape (docs/performance.md). The order of the additions is the calls'
// order, so the result is the same on every run.
std::vector<at::Tensor> gather_rows(const at::Tensor& rows, const std::vector<at::Tensor>& index, bool disjoint);

}  // namespace dflash::drafter
