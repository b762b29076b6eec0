// How many queries one block of the row-invariant decoding attention
// (cuda_kernels.cu) takes; its own header so that code built without CUDA
// (kernel_ops.h's callers) names it too.
#pragma once

namespace dflash::cuda_kernels {

// The most queries one block takes: query heads sharing a KV head, and
// queries in all (heads × tokens of the step); each a power of two. The
// defaults are the compiled maxima and what decoding uses; lower caps exist
// to time the other tilings (bench/kernel_bench.cpp) and to test that a
// query's bits never depend on them.
struct AttentionTiling {
  int max_heads = 4;
  int max_queries = 8;
};

}  // namespace dflash::cuda_kernels
