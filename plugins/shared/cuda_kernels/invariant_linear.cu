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
// chain's 16-row block. The block's threads copy each chunk of x's rows and
// of its 128 weight rows into shared memory with cp.async, three chunks
// ahead; its 8 warps own 2 tiles of 8 features each and read the chunk from
// there, so x is read from L2 once per 128 features. The runs of k give the
// grid enough blocks to keep the memory busy on narrow projections; their
// fp32 partial sums go through a workspace and a second kernel adds them.
#include "cuda_kernels.h"
#include "device_math.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <algorithm>
#include <cstdint>

namespace dflash::cuda_kernels {
namespace {

constexpr int kLinearWarps = 8;
constexpr int kFeatureTiles = 2;                                // 8-feature mma tiles per warp
constexpr int64_t kBlockFeatures = kLinearWarps * kFeatureTiles * 8;  // 128
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

// Block (blockIdx.x, blockIdx.y, blockIdx.z): features [128·x, +128), run y of
// k's chunks, rows [16·kTiles·z, +16·kTiles). Warp w owns the feature tiles
// 128·x + 16·w + 8·f, f < 2.
//
// The block's threads copy each chunk's rows of x and of the weight into
// shared memory with cp.async, kStages − 1 chunks ahead of the one being
// multiplied, so the weights stream with many loads in flight and no
// register holds them on the way. A stage holds kTiles·16 rows of x, then
// the block's 128 weight rows, each row 32 elements (64 bytes; eight lanes
// reading 16 bytes each of two adjacent rows touch every bank once).
//
// Lane (group = lane / 4, quad = lane % 4) reads 8 consecutive k of chunk c —
// k = 32c + 8·quad … +7 — from x rows group and group + 8 of each row tile
// and from weight row (its feature tile's first feature) + group; k pairs
// (0,1), (2,3) feed the first mma's A/B slots (2·quad, 2·quad + 1) and
// (2·quad + 8, +9), pairs (4,5), (6,7) the second's. A and B see the same
// permutation of k, so the products are the right ones; k past in_features
// (a multiple of 8), rows past all_rows and features past out_features are
// zeros in shared memory.
// partial null: one run, the epilogue here; else the run's sums go to
// partial[y][row][feature] for add_runs.
//
// Two blocks an SM (at most 128 registers a thread; shared memory
// linear_shared_bytes(kTiles) each).
constexpr int kStages = 4;
constexpr int kChunkBytes = 64;  // 32 elements of 2 bytes

template <int kTiles>
__host__ __device__ constexpr int stage_bytes() {
  return (kTiles * 16 + static_cast<int>(kBlockFeatures)) * kChunkBytes;
}
template <int kTiles>
__host__ __device__ constexpr int linear_shared_bytes() {
  return kStages * stage_bytes<kTiles>();
}

template <class T, int kTiles>
__global__ void __launch_bounds__(kLinearWarps * 32, 2)
    invariant_linear_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                            const T* residual, T* out, float* __restrict__ partial, int all_rows, int64_t out_features,
                            int64_t in_features, int64_t chunks_per_split) {
  using P = Pack<T, 8>;
  extern __shared__ __align__(16) unsigned char linear_shared[];
  constexpr int kRows = kTiles * 16;
  constexpr int kLines = kRows + static_cast<int>(kBlockFeatures);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int first_row = static_cast<int>(blockIdx.z) * kRows;
  const int64_t block_feature = static_cast<int64_t>(blockIdx.x) * kBlockFeatures;
  const int64_t first_feature = block_feature + warp * kFeatureTiles * 8;
  // A warp past out_features still copies and meets the block's barriers.
  const bool warp_active = first_feature < out_features;
  const int64_t chunks = (in_features + 31) / 32;
  const int64_t c_begin = static_cast<int64_t>(blockIdx.y) * chunks_per_split;
  const int64_t c_end = c_begin + chunks_per_split < chunks ? c_begin + chunks_per_split : chunks;
  const int64_t n = c_end - c_begin;

  // Chunk c into stage `stage`: 16-byte pieces (line, quarter), x's lines first.
  auto copy_chunk = [&](int64_t c, int stage) {
    unsigned char* base = linear_shared + stage * stage_bytes<kTiles>();
    for (int piece = threadIdx.x; piece < kLines * 4; piece += blockDim.x) {
      const int line = piece / 4, quarter = piece % 4;
      const int64_t k = c * 32 + quarter * 8;
      unsigned char* dst = base + line * kChunkBytes + quarter * 16;
      const T* src = nullptr;
      if (k < in_features) {
        if (line < kRows) {
          if (first_row + line < all_rows) src = x + static_cast<int64_t>(first_row + line) * in_features + k;
        } else if (block_feature + (line - kRows) < out_features) {
          src = weight + (block_feature + (line - kRows)) * in_features + k;
        }
      }
      if (src != nullptr) __pipeline_memcpy_async(dst, src, 16);
      else *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
    }
  };

  float d[kTiles][kFeatureTiles][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int f = 0; f < kFeatureTiles; ++f) d[t][f][0] = d[t][f][1] = d[t][f][2] = d[t][f][3] = 0.f;

  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n) copy_chunk(c_begin + s, s);
    __pipeline_commit();
  }
  for (int64_t i = 0; i < n; ++i) {
    // This thread's copies of chunk i are done; the barrier makes every
    // thread's visible, and tells that chunk i − 1's stage, refilled below,
    // has been read by all.
    __pipeline_wait_prior(kStages - 2);
    __syncthreads();
    if (i + kStages - 1 < n) copy_chunk(c_begin + i + kStages - 1, static_cast<int>((i + kStages - 1) % kStages));
    __pipeline_commit();
    if (!warp_active) continue;
    const unsigned char* base = linear_shared + static_cast<int>(i % kStages) * stage_bytes<kTiles>();
    uint32_t b0[kFeatureTiles][2], b1[kFeatureTiles][2];
#pragma unroll
    for (int f = 0; f < kFeatureTiles; ++f) {
      const int line = kRows + warp * kFeatureTiles * 8 + f * 8 + group;
      const P w = *reinterpret_cast<const P*>(base + line * kChunkBytes + quad * 16);
      const uint32_t* wv = reinterpret_cast<const uint32_t*>(&w);
      b0[f][0] = wv[0];
      b0[f][1] = wv[1];
      b1[f][0] = wv[2];
      b1[f][1] = wv[3];
    }
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const P lo = *reinterpret_cast<const P*>(base + (t * 16 + group) * kChunkBytes + quad * 16);
      const P hi = *reinterpret_cast<const P*>(base + (t * 16 + group + 8) * kChunkBytes + quad * 16);
      const uint32_t* lv = reinterpret_cast<const uint32_t*>(&lo);
      const uint32_t* hv = reinterpret_cast<const uint32_t*>(&hi);
      const uint32_t a0[4] = {lv[0], hv[0], lv[1], hv[1]};
      const uint32_t a1[4] = {lv[2], hv[2], lv[3], hv[3]};
#pragma unroll
      for (int f = 0; f < kFeatureTiles; ++f) {
        mma_16x8x16<T>(d[t][f], a0, b0[f]);
        mma_16x8x16<T>(d[t][f], a1, b1[f]);
      }
    }
  }
  if (!warp_active) return;

  // d[t][f][e] is row first_row + 16t + group (+8 for e ≥ 2), feature
  // first_feature + 8f + 2·quad + (e & 1).
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int f = 0; f < kFeatureTiles; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = first_row + t * 16 + group + (e >= 2 ? 8 : 0);
        const int64_t j = first_feature + f * 8 + 2 * quad + (e & 1);
        if (row >= all_rows || j >= out_features) continue;
        if (partial == nullptr) store_output<T>(d[t][f][e], bias, residual, out, row, j, out_features);
        else partial[(static_cast<int64_t>(blockIdx.y) * all_rows + row) * out_features + j] = d[t][f][e];
      }
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

template <class T>
void invariant_linear_typed(const void* x, const void* w, const void* bias, const void* residual, void* out,
                            float* workspace, int64_t rows, int64_t out_features, int64_t in_features,
                            cudaStream_t stream) {
  if (rows == 0 || out_features == 0) return;
  const int64_t splits = invariant_linear_splits(out_features, in_features);
  const int64_t per_split = ((in_features + 31) / 32 + splits - 1) / splits;  // chunks a run
  // All row tiles in one block up to 9 (a draft tree of up to 128 nodes and
  // the newest token), so each weight is read from memory once; more rows go
  // in blocks of 9 tiles, each reading the weights once more (a 256-node tree:
  // twice). 7 tiles take the 8-tile kernel (one tile of zeros).
  const int64_t tiles = (rows + 15) / 16;
  const int per_block = tiles > kMaxRowTiles ? kMaxRowTiles : tiles == 7 ? 8 : static_cast<int>(tiles);
  const dim3 blocks(static_cast<unsigned>((out_features + kBlockFeatures - 1) / kBlockFeatures),
                    static_cast<unsigned>(splits), static_cast<unsigned>((tiles + per_block - 1) / per_block));
  float* partial = splits > 1 ? workspace : nullptr;
  auto launch = [&](auto kernel, int shared) {
    opt_in_shared_memory(reinterpret_cast<const void*>(kernel), static_cast<size_t>(shared), "invariant_linear");
    kernel<<<blocks, kLinearWarps * 32, shared, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<const T*>(residual),
        static_cast<T*>(out), partial, static_cast<int>(rows), out_features, in_features, per_split);
  };
  switch (per_block) {
    case 9: launch(invariant_linear_kernel<T, 9>, linear_shared_bytes<9>()); break;
    case 8: launch(invariant_linear_kernel<T, 8>, linear_shared_bytes<8>()); break;
    case 6: launch(invariant_linear_kernel<T, 6>, linear_shared_bytes<6>()); break;
    case 5: launch(invariant_linear_kernel<T, 5>, linear_shared_bytes<5>()); break;
    case 4: launch(invariant_linear_kernel<T, 4>, linear_shared_bytes<4>()); break;
    case 3: launch(invariant_linear_kernel<T, 3>, linear_shared_bytes<3>()); break;
    case 2: launch(invariant_linear_kernel<T, 2>, linear_shared_bytes<2>()); break;
    default: launch(invariant_linear_kernel<T, 1>, linear_shared_bytes<1>()); break;
  }
  check_launch("invariant_linear");
  if (partial == nullptr) return;
  constexpr int kThreads = 256;
  const int64_t elements = rows * out_features;
  add_runs_kernel<T><<<static_cast<unsigned>((elements + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      partial, static_cast<const T*>(bias), static_cast<const T*>(residual), static_cast<T*>(out), rows, out_features,
      static_cast<int>(splits));
  check_launch("invariant_linear (adding the runs of k)");
}

}  // namespace

int64_t invariant_linear_splits(int64_t out_features, int64_t in_features) {
  const int64_t chunks = (in_features + 31) / 32;
  const int64_t feature_blocks = std::max<int64_t>(1, (out_features + kBlockFeatures - 1) / kBlockFeatures);
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
  if (e == Element::kBFloat16)
    invariant_linear_typed<__nv_bfloat16>(x, weight, bias, residual, out, workspace, rows, out_features, in_features,
                                          stream);
  else
    invariant_linear_typed<__half>(x, weight, bias, residual, out, workspace, rows, out_features, in_features, stream);
}

bool invariant_linear_fits(int64_t rows, int64_t in_features, const void* x, const void* weight) {
  return rows <= kMaxRowTiles * 16 * int64_t{65535} && in_features % 8 == 0 && aligned16(x) && aligned16(weight);
}

}  // namespace dflash::cuda_kernels
