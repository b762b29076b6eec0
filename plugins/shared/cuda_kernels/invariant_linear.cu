// invariant_linear: exact decoding's row-invariant projection (cuda_kernels.h).
//
// The arithmetic of an output element (row r, feature j) is fixed by the
// weight's shape alone: k is cut into 32-wide chunks and the chunks into
// `splits` consecutive runs (invariant_linear_splits, from out_features and
// in_features only); a run's chunks are multiplied into one fp32 accumulator
// in order on the tensor cores (mma.m16n8k16, two per chunk, the same k
// permutation for A and B); the runs' sums are then added in run order, then
// the bias, then the residual, and the result is rounded once. An mma's
// output element is the sum of its own row and its own column only, so a row
// gets the same bits in a tile of zeros as among 128 other draft-tree nodes.
//
// Speed: a tree of up to 128 nodes (9 tiles of 16 rows with the newest token)
// is one block's rows, so each weight is read from memory once, as for a
// chain's 16-row block. The block's threads copy each stage's chunks of x's
// rows and of its weight rows into shared memory with cp.async, stages
// ahead, each thread a fixed set of 16-byte pieces whose pointers it works
// out once; its 8 warps own 2 or 4 tiles of 8 features each and read the
// stage from there, so x is read from L2 once per block of features. The
// tiling (row tiles, chunks a stage, stages, warps, feature tiles a warp)
// changes no bit and is picked by row count (launch_products_for_rows). The
// runs of k give the grid enough blocks to keep the memory busy on narrow
// projections; their fp32 partial sums go through a workspace and a second
// kernel adds them (or, where set_invariant_linear_most_cluster_runs allows,
// with the warpgroup products, the cluster of a call's runs adds them in its
// shared memory, in the same order: sum_runs_in_cluster; off by default).
#include "cluster.cuh"
#include "cuda_kernels.h"
#include "device_math.cuh"
#include "wgmma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace dflash::cuda_kernels {
namespace {

// The split rule's unit of features (invariant_linear_splits). A constant
// of the rule, not a block's width: the runs, and so the bits, must not move
// when a launch's tiling does.
constexpr int64_t kSplitFeatures = 128;
constexpr int kMaxRowTiles = 9;                                 // 16-row tiles per block
// Blocks the grid should have for one row tile, so that a narrow projection
// keeps every SM's memory pipe busy: about 4 blocks on each of 132 SMs. A
// constant, not the device's SM count, so the split (and the bits) do not
// change with the card.
constexpr int64_t kGridBlocks = 512;
constexpr int64_t kMinChunksPerSplit = 8;
constexpr int64_t kMaxSplits = 32;

template <class T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma_16x8x16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16x8x16<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The epilogue every path shares: the k sum, then the bias, then the
// residual, each add rounded to nearest, then one rounding to T.
template <class T>
__device__ __forceinline__ void store_output(float y, const T* bias, const T* residual, T* out, int64_t row, int64_t j,
                                             int64_t out_features) {
  if (bias != nullptr) y = __fadd_rn(y, to_float(bias[j]));
  if (residual != nullptr) y = __fadd_rn(y, to_float(residual[row * out_features + j]));
  out[row * out_features + j] = from_float<T>(y);
}

// A block's shape: kTiles 16-row tiles of x against kWarps · 16 features,
// kChunks 32-wide chunks of k a pipeline stage, kStages stages. None of these
// changes a bit of the result (the arithmetic is per row and feature, in
// chunk order), so the launcher picks them by row count for speed alone.
template <int Tiles, int Chunks, int Stages, int Warps, int FeatureTiles>
struct Tiling {
  static constexpr int kTiles = Tiles, kChunks = Chunks, kStages = Stages, kWarps = Warps;
  static constexpr int kFeatureTiles = FeatureTiles;  // 8-feature mma tiles a warp
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kTiles * 16;
  static constexpr int kFeatures = kWarps * kFeatureTiles * 8;
  static constexpr int kLineBytes = kChunks * 64;  // a line: one row's kChunks chunks (32 elements of 2 bytes each)
  static constexpr int kPieces = kLineBytes / 16;  // 16-byte pieces a line
  static constexpr int kLines = kRows + kFeatures;
  static constexpr int kStageBytes = kLines * kLineBytes;
  static constexpr int kSharedBytes = kStages * kStageBytes;
  // Each SM holds 16 warps (at most 128 registers a thread), or 8 where the
  // accumulators alone would take more than 80.
  static constexpr int kMinBlocks = (kTiles * kFeatureTiles * 4 > 80 ? 8 : 16) / kWarps;
};

// A 16-byte piece's place in its line. Lines of two chunks or more are 128
// bytes or a multiple, so rows r and r + 1 would share banks; odd lines swap
// the halves of each 128 bytes so that the 8 lanes of a quarter-warp (two
// lines, four pieces each) read all 32 banks once.
template <class Tl>
__device__ __forceinline__ int piece_offset(int line, int piece) {
  if constexpr (Tl::kChunks >= 2) piece ^= (line & 1) << 2;
  return line * Tl::kLineBytes + piece * 16;
}

// A thread's fixed share of every pipeline stage's copy, for both kernels:
// kPasses 16-byte pieces, pass j at shared offset (its first offset) +
// j·kPassBytes of a stage's kStageBytes buffer, from src[j] (at the run's
// first k; stage s reads it kStageK·s further on). The pointers are worked
// out once, so a stage's copy is a pointer add and a cp.async a piece. A
// pass whose line is of a row or feature past the ends has no source: its
// piece is zeroed in each of the kStages buffers once, here. A piece at k
// past in_features (the last chunk's tail) or past the run's end is zeros.
template <class T, int kPasses, int kPassBytes, int kStages, int kStageBytes, int kStageK>
struct StageCopy {
  const T* src[kPasses];
  unsigned char* first;  // pass 0's piece in buffer 0
  int64_t k_first, k_end;

  // line(j): pass j's line of `lines`, source(line): its first piece's
  // global address (null past the ends), offset(line): its piece's offset in
  // a stage (offset(line(j)) = offset(line(0)) + j·kPassBytes).
  template <class Line, class Source, class Offset>
  __device__ __forceinline__ StageCopy(unsigned char* shared, int lines, int64_t k_first_, int64_t k_end_, Line line,
                                       Source source, Offset offset)
      : first(shared + offset(line(0))), k_first(k_first_), k_end(k_end_) {
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      const int l = line(j);
      src[j] = l < lines ? source(l) : nullptr;
      if (src[j] == nullptr && l < lines)
        for (int buffer = 0; buffer < kStages; ++buffer)
          *reinterpret_cast<uint4*>(shared + buffer * kStageBytes + offset(l)) = make_uint4(0u, 0u, 0u, 0u);
    }
  }

  // Stage s into buffer `buffer`.
  __device__ __forceinline__ void copy(int64_t s, int buffer) const {
    unsigned char* base = first + buffer * kStageBytes;
    const int64_t step = s * kStageK;
    const bool k_in = k_first + step < k_end;
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      if (src[j] == nullptr) continue;
      unsigned char* dst = base + j * kPassBytes;
      if (k_in) __pipeline_memcpy_async(dst, src[j] + step, 16);
      else *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
};

// Block (blockIdx.x, blockIdx.y, blockIdx.z): rows [kRows·x, +kRows), features
// [kFeatures·y, +kFeatures), run z of k's chunks. Warp w owns the feature
// tiles kFeatures·y + 8·(kFeatureTiles·w + f), f < kFeatureTiles.
//
// The block's threads copy each stage's kChunks chunks of its rows of x and
// of its weight rows into shared memory with cp.async, kStages − 1 stages
// ahead of the one being multiplied, so the weights stream with many loads
// in flight and no register holds them on the way. A stage holds the kRows
// lines of x, then the kFeatures lines of the weight (piece_offset).
//
// Lane (group = lane / 4, quad = lane % 4) reads 8 consecutive k of chunk c —
// k = 32c + 8·quad … +7 — from x rows group and group + 8 of each row tile
// and from weight row (its feature tile's first feature) + group; k pairs
// (0,1), (2,3) feed the first mma's A/B slots (2·quad, 2·quad + 1) and
// (2·quad + 8, +9), pairs (4,5), (6,7) the second's. A and B see the same
// permutation of k, so the products are the right ones; k past in_features
// (a multiple of 8), rows past all_rows and features past out_features are
// zeros in shared memory, and chunks past the run's end are not multiplied.
// partial null: one run, the epilogue here; else the run's sums go to
// partial[z][row][feature] for add_runs.
template <class T, class Tl>
__global__ void __launch_bounds__(Tl::kThreads, Tl::kMinBlocks)
    invariant_linear_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                            const T* residual, T* out, float* __restrict__ partial, int all_rows, int64_t out_features,
                            int64_t in_features, int64_t chunks_per_split) {
  using P = Pack<T, 8>;
  extern __shared__ __align__(16) unsigned char linear_shared[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int first_row = static_cast<int>(blockIdx.x) * Tl::kRows;
  const int64_t block_feature = static_cast<int64_t>(blockIdx.y) * Tl::kFeatures;
  const int64_t first_feature = block_feature + warp * Tl::kFeatureTiles * 8;
  // A warp past out_features still copies and meets the block's barriers.
  const bool warp_active = first_feature < out_features;
  const int64_t chunks = (in_features + 31) / 32;
  const int64_t c_begin = static_cast<int64_t>(blockIdx.z) * chunks_per_split;
  const int64_t c_end = c_begin + chunks_per_split < chunks ? c_begin + chunks_per_split : chunks;
  const int64_t n = c_end - c_begin;
  const int64_t stages = (n + Tl::kChunks - 1) / Tl::kChunks;

  // This thread's pieces (StageCopy): threadIdx.x + j·kThreads of the
  // stage's lines. kThreads is a multiple of kPieces, so the piece (k's
  // offset in the line) is the same for every j and the line steps by
  // kLineStep.
  constexpr int kPasses = (Tl::kLines * Tl::kPieces + Tl::kThreads - 1) / Tl::kThreads;
  constexpr int kLineStep = Tl::kThreads / Tl::kPieces;
  static_assert(Tl::kThreads % Tl::kPieces == 0 && kLineStep % 2 == 0, "a thread's pieces share piece_offset's swap");
  const int piece = threadIdx.x % Tl::kPieces, first_line = threadIdx.x / Tl::kPieces;
  const int64_t k_first = c_begin * 32 + piece * 8;
  const StageCopy<T, kPasses, kLineStep * Tl::kLineBytes, Tl::kStages, Tl::kStageBytes, Tl::kChunks * 32> stage_copy(
      linear_shared, Tl::kLines, k_first, c_end * 32 < in_features ? c_end * 32 : in_features,
      [&](int j) { return first_line + j * kLineStep; },
      [&](int line) -> const T* {
        if (line < Tl::kRows)
          return first_row + line < all_rows ? x + static_cast<int64_t>(first_row + line) * in_features + k_first
                                             : nullptr;
        const int64_t feature = block_feature + (line - Tl::kRows);
        return feature < out_features ? weight + feature * in_features + k_first : nullptr;
      },
      [&](int line) { return piece_offset<Tl>(line, piece); });

  float d[Tl::kTiles][Tl::kFeatureTiles][4];
#pragma unroll
  for (int t = 0; t < Tl::kTiles; ++t)
#pragma unroll
    for (int f = 0; f < Tl::kFeatureTiles; ++f) d[t][f][0] = d[t][f][1] = d[t][f][2] = d[t][f][3] = 0.f;

  for (int s = 0; s < Tl::kStages - 1; ++s) {
    if (s < stages) stage_copy.copy(s, s);
    __pipeline_commit();
  }
  for (int64_t s = 0; s < stages; ++s) {
    // This thread's copies of stage s are done; the barrier makes every
    // thread's visible, and tells that stage s − 1's buffer, refilled below,
    // has been read by all.
    __pipeline_wait_prior(Tl::kStages - 2);
    __syncthreads();
    if (s + Tl::kStages - 1 < stages)
      stage_copy.copy(s + Tl::kStages - 1, static_cast<int>((s + Tl::kStages - 1) % Tl::kStages));
    __pipeline_commit();
    if (!warp_active) continue;
    const unsigned char* base = linear_shared + static_cast<int>(s % Tl::kStages) * Tl::kStageBytes;
#pragma unroll
    for (int cc = 0; cc < Tl::kChunks; ++cc) {
      if (s * Tl::kChunks + cc >= n) break;
      uint32_t b0[Tl::kFeatureTiles][2], b1[Tl::kFeatureTiles][2];
#pragma unroll
      for (int f = 0; f < Tl::kFeatureTiles; ++f) {
        const int line = Tl::kRows + warp * Tl::kFeatureTiles * 8 + f * 8 + group;
        const P w = *reinterpret_cast<const P*>(base + piece_offset<Tl>(line, cc * 4 + quad));
        const uint32_t* wv = reinterpret_cast<const uint32_t*>(&w);
        b0[f][0] = wv[0];
        b0[f][1] = wv[1];
        b1[f][0] = wv[2];
        b1[f][1] = wv[3];
      }
#pragma unroll
      for (int t = 0; t < Tl::kTiles; ++t) {
        const P lo = *reinterpret_cast<const P*>(base + piece_offset<Tl>(t * 16 + group, cc * 4 + quad));
        const P hi = *reinterpret_cast<const P*>(base + piece_offset<Tl>(t * 16 + group + 8, cc * 4 + quad));
        const uint32_t* lv = reinterpret_cast<const uint32_t*>(&lo);
        const uint32_t* hv = reinterpret_cast<const uint32_t*>(&hi);
        const uint32_t a0[4] = {lv[0], hv[0], lv[1], hv[1]};
        const uint32_t a1[4] = {lv[2], hv[2], lv[3], hv[3]};
#pragma unroll
        for (int f = 0; f < Tl::kFeatureTiles; ++f) {
          mma_16x8x16<T>(d[t][f], a0, b0[f]);
          mma_16x8x16<T>(d[t][f], a1, b1[f]);
        }
      }
    }
  }
  if (!warp_active) return;

  // d[t][f][e] is row first_row + 16t + group (+8 for e ≥ 2), feature
  // first_feature + 8f + 2·quad + (e & 1).
#pragma unroll
  for (int t = 0; t < Tl::kTiles; ++t)
#pragma unroll
    for (int f = 0; f < Tl::kFeatureTiles; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = first_row + t * 16 + group + (e >= 2 ? 8 : 0);
        const int64_t j = first_feature + f * 8 + 2 * quad + (e & 1);
        if (row >= all_rows || j >= out_features) continue;
        if (partial == nullptr) store_output<T>(d[t][f][e], bias, residual, out, row, j, out_features);
        else partial[(static_cast<int64_t>(blockIdx.z) * all_rows + row) * out_features + j] = d[t][f][e];
      }
}

// The warpgroup-MMA products, run only by builds for sm_90a (use_wgmma;
// the default build, for the GPU's own architecture, runs the mma.sync
// kernel). A block's two warpgroups own 64 features each; one wgmma
// m64nNk16 multiplies a warpgroup's 64 weight rows by all N of the block's x
// rows (launch_products_wgmma) over 16 of k, both read from shared memory by
// the tensor cores, so no register holds an operand and no warp rereads x.
// k is summed in order, 16 at a time, each run of chunks into one fp32
// accumulator, as in the mma.sync kernel. On an H100 nearly all bits were
// the mma.sync kernel's, not all (the tensor cores' sum within 16 of k), so
// one process uses one kernel for every row count.
// bench/invariant_linear/wgmma_probe.cu checks and times them on the GPU:
// on an H100 (2026-12-07, docs/eval.md) a layer's projections cost 1.12×
// from 16 to 65 rows, against the mma.sync kernel's 1.29×.
//
// A stage holds 64 of k (2 chunks) of the block's 128 weight lines, then of
// its N x lines, each line's 128 bytes in the 128-byte swizzle layout
// (wgmma_descriptor_swizzled_128): atoms of 8 lines, a line's 16-byte group
// g at g ^ (line % 8), so the 8 threads that copy a line's 128 contiguous
// bytes write all 32 banks. (The layout without swizzle puts a line's groups
// 128 bytes apart: each warp's copy then read 8 lines' 64 bytes, and the
// kernel streamed the weights at 1.9 TB/s against 2.9 swizzled.)
// InFlight 1 keeps a stage's products running while the next stage's are
// issued; the copies then run Stages − 2 stages ahead, not Stages − 1 (the
// buffer the running products read is not refilled until they are done).
// Warpgroups 2 (128 features a block) or 4 (256): every block reads all its
// rows of x, so wider blocks read x half as often (at 65 rows a gate/up call
// read about 410 MB of x from L2 beside 805 MB of weights: docs/eval.md,
// "Ninth run"), at the cost of half as many blocks and fewer stages.
template <int RowsPadded, int Stages, int InFlight, int Warpgroups = 2>
struct WgTiling {
  static constexpr int kN = RowsPadded, kStages = Stages, kInFlight = InFlight;
  static constexpr int kAhead = kStages - 1 - kInFlight;  // stages copied ahead of the products
  static_assert(kAhead >= 1, "at least one stage copied ahead");
  static constexpr int kThreads = 128 * Warpgroups;
  static constexpr int kFeatures = 64 * Warpgroups;  // 64 a warpgroup
  static constexpr int kLinesAPass = kThreads / 8;   // lines one pass of the block's copy moves
  static constexpr int kStageK = 64;                 // 2 chunks: a line's 128 bytes
  static constexpr int kLines = kFeatures + kN;     // the weight's lines, then x's
  static constexpr int kStageBytes = kLines * 128;
  // The swizzle's atoms are 1024-aligned in shared memory: room to align.
  static constexpr int kSharedBytes = kStages * kStageBytes + 1024;
  // A run's sums for the cluster's adding (sum_runs_in_cluster): kN rows of
  // the block's 128 features, 4 floats apart more than a row's, so that the
  // 4 rows a warp's store covers fall in different banks; in the stages'
  // buffers, which the products no longer read.
  static constexpr int kSumStride = kFeatures + 4;
  static_assert(kN * kSumStride * 4 <= kStages * kStageBytes, "a run's sums fit in the stages' shared memory");
  static_assert(kSharedBytes <= 227 * 1024, "a block's stages fit in an SM's shared memory");
};

// Block (x, y, z): rows [kN·x, +kN), features [kFeatures·y, +kFeatures),
// run z. Each thread's pieces and pointers are fixed once (StageCopy, as in
// the mma.sync kernel): lanes tid % 8 take a line's 8 groups, tid / 8 the
// line; a pass moves kLinesAPass lines.
//
// sum_in_cluster: the grid's runs are one cluster (launch_products_wgmma_tiled)
// and add their sums there (sum_runs_in_cluster); partial is then null.
template <class T, class Wg>
__device__ __forceinline__ void sum_runs_in_cluster(const float (&d)[Wg::kN / 2], float* sums, const T* bias,
                                                    const T* residual, T* out, int first_row, int all_rows,
                                                    int64_t block_feature, int64_t out_features);

template <class T, class Wg>
__global__ void __launch_bounds__(Wg::kThreads, 1)
    invariant_linear_wgmma_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                                  const T* residual, T* out, float* __restrict__ partial, int all_rows,
                                  int64_t out_features, int64_t in_features, int64_t chunks_per_split,
                                  bool sum_in_cluster) {
  extern __shared__ __align__(128) unsigned char wgmma_dynamic_shared[];
  unsigned char* const wgmma_shared =
      wgmma_dynamic_shared + (1024 - __cvta_generic_to_shared(wgmma_dynamic_shared) % 1024) % 1024;
  const int tid = static_cast<int>(threadIdx.x);
  const int first_row = static_cast<int>(blockIdx.x) * Wg::kN;
  const int64_t block_feature = static_cast<int64_t>(blockIdx.y) * Wg::kFeatures;
  const int64_t chunks = (in_features + 31) / 32;
  const int64_t c_begin = static_cast<int64_t>(blockIdx.z) * chunks_per_split;
  const int64_t c_end = c_begin + chunks_per_split < chunks ? c_begin + chunks_per_split : chunks;
  const int64_t stages = (c_end - c_begin + 1) / 2;

  constexpr int kPasses = (Wg::kLines * 8 + Wg::kThreads - 1) / Wg::kThreads;
  const int g = tid % 8;
  const int64_t k_first = c_begin * 32 + g * 8;
  const StageCopy<T, kPasses, Wg::kLinesAPass * 128, Wg::kStages, Wg::kStageBytes, Wg::kStageK> stage_copy(
      wgmma_shared, Wg::kLines, k_first, c_end * 32 < in_features ? c_end * 32 : in_features,
      [&](int j) { return tid / 8 + Wg::kLinesAPass * j; },
      [&](int line) -> const T* {
        if (line < Wg::kFeatures)
          return block_feature + line < out_features ? weight + (block_feature + line) * in_features + k_first
                                                     : nullptr;
        const int row = first_row + (line - Wg::kFeatures);
        return row < all_rows ? x + static_cast<int64_t>(row) * in_features + k_first : nullptr;
      },
      [&](int line) { return (line / 8) * 1024 + (line % 8) * 128 + ((g ^ (line % 8)) * 16); });

  float d[Wg::kN / 2];
#pragma unroll
  for (int i = 0; i < Wg::kN / 2; ++i) d[i] = 0.f;
  const int group = tid / 128;
  // Product h's operands in a stage at `base`: the warpgroup's 64 weight
  // lines (A) and the x lines after the block's 128 weight lines (B), 16 of k
  // (32 bytes) further on a product.
  auto descriptor = [&](const unsigned char* base, int first_line, int h) {
    return wgmma_descriptor_swizzled_128(base + first_line * 128 + h * 32, 1024);
  };

  for (int s = 0; s < Wg::kAhead; ++s) {
    if (s < stages) stage_copy.copy(s, s);
    __pipeline_commit();
  }
  for (int64_t s = 0; s < stages; ++s) {
    // This thread's copies of stage s are done and made visible to the
    // tensor cores' reads; the barrier makes every thread's so, and tells
    // that stage s − 1 − kInFlight's products (waited for below) are done
    // with the buffer refilled here.
    __pipeline_wait_prior(Wg::kAhead - 1);
    fence_proxy_async_shared();
    __syncthreads();
    if (s + Wg::kAhead < stages)
      stage_copy.copy(s + Wg::kAhead, static_cast<int>((s + Wg::kAhead) % Wg::kStages));
    __pipeline_commit();
    const unsigned char* base = wgmma_shared + static_cast<int>(s % Wg::kStages) * Wg::kStageBytes;
    wgmma_hold<Wg::kN>(d);
    wgmma_fence();
    // 16 of k a product, every stage whole: k past the run's end is zeros in
    // shared memory (StageCopy), which add nothing, at the same k for every
    // row count. (A branch between the products would make the compiler
    // fence the accumulators before each.)
#pragma unroll
    for (int h = 0; h < Wg::kStageK / 16; ++h) {
      wgmma_mma<T, Wg::kN>(d, descriptor(base, group * 64, h), descriptor(base, Wg::kFeatures, h));
    }
    wgmma_commit();
    wgmma_wait_prior<Wg::kInFlight>();
  }
  wgmma_wait_all();
  wgmma_hold<Wg::kN>(d);
  if (sum_in_cluster) {
    // Both warpgroups' products are done with the stages before their
    // buffers take the sums.
    __syncthreads();
    sum_runs_in_cluster<T, Wg>(d, reinterpret_cast<float*>(wgmma_shared), bias, residual, out, first_row, all_rows,
                               block_feature, out_features);
    return;
  }

  // d[i]: feature 64·group + 16·warp + lane / 4 (+8 where i % 4 ≥ 2), row
  // 8·(i / 4) + 2·(lane % 4) + i % 2 (the accumulators' fragment layout).
  const int warp = (tid % 128) / 32, lane = tid % 32;
#pragma unroll
  for (int i = 0; i < Wg::kN / 2; ++i) {
    const int64_t j = block_feature + group * 64 + warp * 16 + lane / 4 + (i % 4 >= 2 ? 8 : 0);
    const int64_t row = first_row + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    if (row >= all_rows || j >= out_features) continue;
    if (partial == nullptr) store_output<T>(d[i], bias, residual, out, row, j, out_features);
    else partial[(static_cast<int64_t>(blockIdx.z) * all_rows + row) * out_features + j] = d[i];
  }
}

// The runs' sums added in the cluster's shared memory, with the arithmetic of
// add_runs_kernel: each block (run z = its rank) stores its sums, the
// cluster meets, then block z adds, for its share of the block's elements
// (every gridDim.z-th 256 of them), run 0's sum and each later run's in run
// order, and writes the epilogue; the cluster meets again before any block
// leaves, so no block's shared memory goes while another reads it. No
// workspace goes through global memory: at 65 rows the four projections of
// a scale-model layer wrote and read about 77 MB of it.
template <class T, class Wg>
__device__ __forceinline__ void sum_runs_in_cluster(const float (&d)[Wg::kN / 2], float* sums, const T* bias,
                                                    const T* residual, T* out, int first_row, int all_rows,
                                                    int64_t block_feature, int64_t out_features) {
  constexpr int kMaxRuns = 16;  // cluster_launch_possible's most blocks
  const int tid = static_cast<int>(threadIdx.x);
  const int group = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
#pragma unroll
  for (int i = 0; i < Wg::kN / 2; ++i) {
    const int feature = group * 64 + warp * 16 + lane / 4 + (i % 4 >= 2 ? 8 : 0);
    const int row = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    sums[row * Wg::kSumStride + feature] = d[i];
  }
  cluster_barrier();
  const int runs = static_cast<int>(gridDim.z), rank = static_cast<int>(blockIdx.z);
  const int rows = all_rows - first_row < Wg::kN ? all_rows - first_row : Wg::kN;
  for (int e = rank * Wg::kThreads + tid; e < rows * Wg::kFeatures; e += runs * Wg::kThreads) {
    const int row = e / Wg::kFeatures, feature = e % Wg::kFeatures;
    const int64_t j = block_feature + feature;
    if (j >= out_features) continue;
    const float* own = sums + row * Wg::kSumStride + feature;
    float run_sums[kMaxRuns];  // all loads issued before the adds, which go in run order
#pragma unroll
    for (int r = 0; r < kMaxRuns; ++r)
      if (r < runs) run_sums[r] = *cluster_peer_shared(own, static_cast<unsigned>(r));
    float y = run_sums[0];
#pragma unroll
    for (int r = 1; r < kMaxRuns; ++r)
      if (r < runs) y = __fadd_rn(y, run_sums[r]);
    store_output<T>(y, bias, residual, out, first_row + row, j, out_features);
  }
  cluster_barrier();
}

// out[row, j] from the runs' sums partial[s][row][j], added in run order.
template <class T>
__global__ void add_runs_kernel(const float* __restrict__ partial, const T* __restrict__ bias, const T* residual, T* out,
                                int64_t rows, int64_t out_features, int splits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t elements = rows * out_features;
  if (i >= elements) return;
  float y = partial[i];
  for (int s = 1; s < splits; ++s) y = __fadd_rn(y, partial[s * elements + i]);
  store_output<T>(y, bias, residual, out, i / out_features, i % out_features, out_features);
}

// One call's operands, its run count and the chunks of each run.
struct LinearCall {
  const void* x;
  const void* weight;
  const void* bias;
  const void* residual;
  void* out;
  float* workspace;
  int64_t rows, out_features, in_features, splits, per_split;
};

LinearCall linear_call(const void* x, const void* weight, const void* bias, const void* residual, void* out,
                       float* workspace, int64_t rows, int64_t out_features, int64_t in_features, int64_t splits) {
  const int64_t per_split = ((in_features + 31) / 32 + splits - 1) / splits;
  return {x, weight, bias, residual, out, workspace, rows, out_features, in_features, splits, per_split};
}

// The products of every row tile, kTiles tiles a block, under tiling Tl.
template <class T, class Tl>
void launch_products(const LinearCall& c, cudaStream_t stream) {
  const int64_t tiles = (c.rows + 15) / 16;
  const dim3 blocks(static_cast<unsigned>((tiles + Tl::kTiles - 1) / Tl::kTiles),
                    static_cast<unsigned>((c.out_features + Tl::kFeatures - 1) / Tl::kFeatures),
                    static_cast<unsigned>(c.splits));
  auto* kernel = invariant_linear_kernel<T, Tl>;
  opt_in_shared_memory(reinterpret_cast<const void*>(kernel), static_cast<size_t>(Tl::kSharedBytes), "invariant_linear");
  kernel<<<blocks, Tl::kThreads, Tl::kSharedBytes, stream>>>(
      static_cast<const T*>(c.x), static_cast<const T*>(c.weight), static_cast<const T*>(c.bias),
      static_cast<const T*>(c.residual), static_cast<T*>(c.out), c.splits > 1 ? c.workspace : nullptr,
      static_cast<int>(c.rows), c.out_features, c.in_features, c.per_split);
  check_launch("invariant_linear");
}

// The runs' sums added in order, then the epilogue (nothing to do for one run).
template <class T>
void launch_add_runs(const LinearCall& c, cudaStream_t stream) {
  if (c.splits == 1) return;
  constexpr int kThreads = 256;
  const int64_t elements = c.rows * c.out_features;
  add_runs_kernel<T><<<static_cast<unsigned>((elements + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      c.workspace, static_cast<const T*>(c.bias), static_cast<const T*>(c.residual), static_cast<T*>(c.out), c.rows,
      c.out_features, static_cast<int>(c.splits));
  check_launch("invariant_linear (adding the runs of k)");
}

// The most runs added in a cluster (set_invariant_linear_most_cluster_runs).
// 1 by default: on an H100 (docs/eval.md, "Ninth run") the clusters were
// slower than the workspace at every row count of the scale model's layer,
// e.g. down at 65 rows 176 µs against 158, o at one row 16.4 against 11.8:
// a cluster's blocks start and wait together, and the workspace's traffic
// stays in L2. Kept for devices where that differs; kernel_bench times both.
std::atomic<int> most_cluster_runs{1};

// The wgmma kernel of tiling Wg, opted in to the shared memory its stages take.
template <class T, class Wg>
auto* opted_in_wgmma_kernel() {
  auto* kernel = invariant_linear_wgmma_kernel<T, Wg>;
  opt_in_shared_memory(reinterpret_cast<const void*>(kernel), static_cast<size_t>(Wg::kSharedBytes),
                       "invariant_linear (wgmma)");
  return kernel;
}

// Whether the call's runs of k are added in a cluster of their blocks: more
// than one run, no more than most_cluster_runs, and the device holds such a
// cluster of this tiling's blocks (asked only then: every decoding linear
// comes here). Either way a row's bits are the same (the same sums, added in
// run order), so a row count whose tiling cannot is no different from one
// that can.
template <class T, class Wg>
bool adds_runs_in_cluster(const LinearCall& c) {
  if (c.splits < 2 || c.splits > most_cluster_runs.load(std::memory_order_relaxed)) return false;
  return cluster_launch_possible(reinterpret_cast<const void*>(opted_in_wgmma_kernel<T, Wg>()),
                                 static_cast<int>(c.splits), Wg::kThreads, static_cast<size_t>(Wg::kSharedBytes));
}

// The products; with several runs of k, their sums added in a cluster of the
// runs' blocks where the device can hold one (true: nothing left for
// launch_add_runs), else written to the workspace.
template <class T, class Wg>
bool launch_products_wgmma_tiled(const LinearCall& c, cudaStream_t stream) {
  const dim3 blocks(static_cast<unsigned>((c.rows + Wg::kN - 1) / Wg::kN),
                    static_cast<unsigned>((c.out_features + Wg::kFeatures - 1) / Wg::kFeatures),
                    static_cast<unsigned>(c.splits));
  auto* kernel = opted_in_wgmma_kernel<T, Wg>();
  if (adds_runs_in_cluster<T, Wg>(c)) {
    launch_in_clusters_along_z("invariant_linear (wgmma, runs added in a cluster)", kernel, blocks, Wg::kThreads,
                               static_cast<size_t>(Wg::kSharedBytes), stream, static_cast<const T*>(c.x),
                               static_cast<const T*>(c.weight), static_cast<const T*>(c.bias),
                               static_cast<const T*>(c.residual), static_cast<T*>(c.out), static_cast<float*>(nullptr),
                               static_cast<int>(c.rows), c.out_features, c.in_features, c.per_split, true);
    return true;
  }
  kernel<<<blocks, Wg::kThreads, Wg::kSharedBytes, stream>>>(
      static_cast<const T*>(c.x), static_cast<const T*>(c.weight), static_cast<const T*>(c.bias),
      static_cast<const T*>(c.residual), static_cast<T*>(c.out), c.splits > 1 ? c.workspace : nullptr,
      static_cast<int>(c.rows), c.out_features, c.in_features, c.per_split, false);
  check_launch("invariant_linear (wgmma)");
  return c.splits == 1;
}

// f(WgTiling<n, kStages, kInFlight, kWarpgroups>{}) for the tiling whose N is
// `n`, among kNs.
template <int kStages, int kInFlight, int kWarpgroups, int... kNs, class F>
bool with_wgmma_tiling_n(int64_t n, F&& f) {
  bool result = false;
  const bool found = ((n == kNs && (result = f(WgTiling<kNs, kStages, kInFlight, kWarpgroups>{}), true)) || ...);
  if (!found) throw std::logic_error("invariant_linear (wgmma): no tiling of " + std::to_string(n) + " rows");
  return result;
}

// One block's N for `rows`: the rows rounded up to 8 up to 80, to 16 up to
// 144; more rows go in blocks of 144.
int64_t wgmma_block_rows(int64_t rows) {
  const int64_t eighths = (rows + 7) / 8;
  return eighths <= 10 ? eighths * 8 : std::min<int64_t>(144, (rows + 15) / 16 * 16);
}

// f(tiling) for the two-warpgroup wgmma tiling of `rows`.
template <int kStages, int kInFlight, class F>
bool with_wgmma_tiling(int64_t rows, F&& f) {
  return with_wgmma_tiling_n<kStages, kInFlight, 2, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 144>(
      wgmma_block_rows(rows), std::forward<F>(f));
}

// f(tiling) for the four-warpgroup tiling of `rows` (up to 80 a block: 5
// stages of 256 weight lines and 80 x lines fill 211 KiB), else the two's.
template <class F>
bool with_wide_wgmma_tiling(int64_t rows, F&& f) {
  const int64_t n = wgmma_block_rows(rows);
  if (n > 80) return with_wgmma_tiling<6, 1>(rows, std::forward<F>(f));
  return with_wgmma_tiling_n<5, 1, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80>(n, std::forward<F>(f));
}

// Warpgroups a block of the wgmma products (set_invariant_linear_warpgroups).
std::atomic<int> wgmma_warpgroups{2};

// f(tiling) for the tiling the process's calls of `rows` run.
template <class F>
bool with_chosen_wgmma_tiling(int64_t rows, F&& f) {
  if (wgmma_warpgroups.load(std::memory_order_relaxed) == 4) return with_wide_wgmma_tiling(rows, std::forward<F>(f));
  return with_wgmma_tiling<6, 1>(rows, std::forward<F>(f));
}

// The wgmma products for the call's rows, in the tiling of kStages stages,
// kInFlight products in flight and two warpgroups (the emulated tests' pick).
// True when the runs' sums are added too (one run, or a cluster's adding).
template <class T, int kStages, int kInFlight>
bool launch_products_wgmma(const LinearCall& c, cudaStream_t stream) {
  return with_wgmma_tiling<kStages, kInFlight>(
      c.rows, [&](auto tiling) { return launch_products_wgmma_tiled<T, decltype(tiling)>(c, stream); });
}

// The same in the tiling the process's calls run (with_chosen_wgmma_tiling).
template <class T>
bool launch_products_wgmma(const LinearCall& c, cudaStream_t stream) {
  return with_chosen_wgmma_tiling(
      c.rows, [&](auto tiling) { return launch_products_wgmma_tiled<T, decltype(tiling)>(c, stream); });
}

// Row tiles a block, by the call's tile count: all of them up to 9 (a draft
// tree of up to 128 nodes and the newest token), so each weight is read from
// memory once; more rows go in blocks of 9 tiles, each reading the weights
// once more (a 256-node tree: twice). 7 tiles take 8 (one tile of zeros).
int tiles_a_block(int64_t rows) {
  const int64_t tiles = (rows + 15) / 16;
  return tiles > kMaxRowTiles ? kMaxRowTiles : tiles == 7 ? 8 : static_cast<int>(tiles);
}

// The tiling for the call's row count, from a sweep of tilings at the scale
// model's projections on an H100 (docs/eval.md, "Fourth run"):
// - one tile (a chain's block, or one token): 4 chunks a stage, 3 stages, so
//   each weight row is read 256 bytes at a time, with 2 blocks an SM;
// - 2 to 5 tiles (trees of up to 64 nodes): 2 chunks a stage, 4 stages;
// - 6 to 9 tiles: 4 feature tiles a warp, which halves the x fragments each
//   warp reads from shared memory, at one block of 8 warps an SM.
template <class T>
void launch_products_for_rows(const LinearCall& c, cudaStream_t stream) {
  switch (tiles_a_block(c.rows)) {
    case 9: launch_products<T, Tiling<9, 2, 4, 8, 4>>(c, stream); break;
    case 8: launch_products<T, Tiling<8, 2, 4, 8, 4>>(c, stream); break;
    case 6: launch_products<T, Tiling<6, 2, 4, 8, 4>>(c, stream); break;
    case 5: launch_products<T, Tiling<5, 2, 4, 8, 2>>(c, stream); break;
    case 4: launch_products<T, Tiling<4, 2, 4, 8, 2>>(c, stream); break;
    case 3: launch_products<T, Tiling<3, 2, 4, 8, 2>>(c, stream); break;
    case 2: launch_products<T, Tiling<2, 2, 4, 8, 2>>(c, stream); break;
    default: launch_products<T, Tiling<1, 4, 3, 8, 2>>(c, stream); break;
  }
}

#ifndef DFLASH_WGMMA_BUILD
#define DFLASH_WGMMA_BUILD 0
#endif
// Whether the products run on the warpgroup MMA: in a build for sm_90a, on a
// compute-capability 9.0 device (the only one sm_90a code runs on), for
// every row count, so a row's bits never depend on which kernel ran.
// The answer is asked of the driver once a device (every linear of every
// decoding step comes here).
bool use_wgmma() {
  if (!DFLASH_WGMMA_BUILD) return false;
  constexpr int kDevices = 64;
  static std::atomic<int8_t> known[kDevices] = {};  // 0: not asked, 1: yes, 2: no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) check_launch("invariant_linear (the current device)");
  if (device < kDevices && known[device].load(std::memory_order_relaxed) != 0)
    return known[device].load(std::memory_order_relaxed) == 1;
  const bool hopper = current_compute_capability() == 90;
  if (device < kDevices) known[device].store(hopper ? 1 : 2, std::memory_order_relaxed);
  return hopper;
}

template <class T>
void invariant_linear_typed(const LinearCall& c, cudaStream_t stream) {
  if (c.rows == 0 || c.out_features == 0) return;
  if (use_wgmma()) {
    if (!launch_products_wgmma<T>(c, stream)) launch_add_runs<T>(c, stream);
    return;
  }
  launch_products_for_rows<T>(c, stream);
  launch_add_runs<T>(c, stream);
}

}  // namespace

int64_t invariant_linear_splits(int64_t out_features, int64_t in_features) {
  const int64_t chunks = (in_features + 31) / 32;
  const int64_t feature_blocks = std::max<int64_t>(1, (out_features + kSplitFeatures - 1) / kSplitFeatures);
  const int64_t wanted = (kGridBlocks + feature_blocks - 1) / feature_blocks;
  const int64_t most = std::max<int64_t>(1, std::min(kMaxSplits, chunks / kMinChunksPerSplit));
  const int64_t splits = std::max<int64_t>(1, std::min(wanted, most));
  // No empty run: the runs are ceil(chunks / splits) chunks long.
  const int64_t per_split = (chunks + splits - 1) / splits;
  return std::max<int64_t>(1, (chunks + per_split - 1) / per_split);
}

int64_t invariant_linear_workspace_floats(int64_t rows, int64_t out_features, int64_t in_features) {
  const int64_t splits = invariant_linear_splits(out_features, in_features);
  return splits > 1 ? splits * rows * out_features : 0;
}

void invariant_linear(Element e, const void* x, const void* weight, const void* bias, const void* residual, void* out,
                      float* workspace, int64_t rows, int64_t out_features, int64_t in_features, cudaStream_t stream) {
  const LinearCall c = linear_call(x, weight, bias, residual, out, workspace, rows, out_features, in_features,
                                   invariant_linear_splits(out_features, in_features));
  if (e == Element::kBFloat16) invariant_linear_typed<__nv_bfloat16>(c, stream);
  else invariant_linear_typed<__half>(c, stream);
}

int current_compute_capability() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    check_launch("the current device's compute capability");
  return major * 10 + minor;
}

bool invariant_linear_runs_wgmma() { return use_wgmma(); }

void set_invariant_linear_most_cluster_runs(int most) {
  if (most < 1 || most > 16)
    throw std::invalid_argument("invariant_linear: the most runs a cluster adds must be 1 to 16 (got " +
                                std::to_string(most) + ")");
  most_cluster_runs.store(most, std::memory_order_relaxed);
}

void set_invariant_linear_warpgroups(int warpgroups) {
  if (warpgroups != 2 && warpgroups != 4)
    throw std::invalid_argument("invariant_linear: a block of the warpgroup products has 2 or 4 warpgroups (got " +
                                std::to_string(warpgroups) + ")");
  wgmma_warpgroups.store(warpgroups, std::memory_order_relaxed);
}

bool invariant_linear_adds_runs_in_cluster(Element e, int64_t rows, int64_t out_features, int64_t in_features) {
  if (!use_wgmma() || rows < 1) return false;
  const LinearCall c = linear_call(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, rows, out_features, in_features,
                                   invariant_linear_splits(out_features, in_features));
  return with_chosen_wgmma_tiling(rows, [&](auto tiling) {
    return e == Element::kBFloat16 ? adds_runs_in_cluster<__nv_bfloat16, decltype(tiling)>(c)
                                   : adds_runs_in_cluster<__half, decltype(tiling)>(c);
  });
}

bool invariant_linear_fits(int64_t rows, int64_t in_features, const void* x, const void* weight) {
  return rows <= kMaxRowTiles * 16 * int64_t{65535} && in_features % 8 == 0 && aligned16(x) && aligned16(weight);
}

}  // namespace dflash::cuda_kernels
