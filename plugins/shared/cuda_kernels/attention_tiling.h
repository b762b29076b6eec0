// How many queries one block of the row-invariant decoding attention
// (cuda_kernels.cu) takes; its own header so that code built without CUDA
// (kernel_ops.h's callers) names it too.
#pragma once

namespace dflash::cuda_kernels {

// The most queries one block takes: query heads sharing a KV head, and
// queries in all (heads × tokens of the step); each a power of two. The
// caps' defaults are the compiled maxima; lower caps exist to time the other
// tilings (bench/kernel_bench.cpp) and to test that a query's bits never
// depend on them.
//
// min_blocks: a block's tokens are then halved while the grid has fewer
// blocks than this (0: the caps alone). Few queries in big blocks leave most
// SMs idle: on an H100 at the scale model's shapes (docs/eval.md, "Eighth
// run"), a 16-token chain took 25.4 µs in blocks of 4 tokens (64 blocks) and
// 14.8 µs in blocks of one (256); a 33-node tree 39.6 µs and 30.8 (528
// blocks); a 65-node tree 54.4 and 43.8 (2 tokens, 528 blocks); a 129-node
// tree was fastest in blocks of 4 (528 blocks). Decoding uses the default.
struct AttentionTiling {
  int max_heads = 4;
  int max_queries = 8;
  int min_blocks = 512;
};

}  // namespace dflash::cuda_kernels
