// Block attention forward for the DFlash drafter's training step, without a
// mask tensor: one thread block per (drafted block, KV head). The block's 16
// slots see exactly the same keys — the context from their document's start
// up to the anchor, then the block's own 16 slots — and the 4 query heads of
// one KV head share them, so the thread block's 64 query rows (4 warps × 16
// slots) run one flash-attention loop over one contiguous key range plus 16
// keys. Nothing outside the allowed pairs is computed beyond the rounding of
// the range's two ends to 64-key tiles.
//
// bf16 in, fp32 accumulation (mma.sync m16n8k16), online softmax; writes the
// output rows and each row's natural-log log-sum-exp (for the backward).
#include "block_attention.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {
namespace {

constexpr int kHeadDim = 128;
constexpr int kSlots = kEntryRows;    // rows per warp: one entry's slots
constexpr int kWarps = 4;             // query heads per KV head
constexpr int kKeysPerTile = 64;
constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per key row
constexpr int kTileBytes = kKeysPerTile * kHeadDim * 2;
constexpr int kStages = 2;
constexpr int kSharedBytes = kStages * 2 * kTileBytes;  // K and V, double buffered

// A 16-byte chunk's place in a tile: rows are 256 bytes, so the 8 rows an
// ldmatrix reads would hit the same banks; the chunk index is XORed with the
// row's low three bits.
__device__ __forceinline__ int swizzled(int row, int chunk) { return row * kChunks + (chunk ^ (row & 7)); }

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared without the registers; src_bytes 0 writes zeros.
__device__ __forceinline__ void copy_async(void* shared, const void* global, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(src_bytes));
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared)));
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared)));
}

// d += a · b: a 16×16 (row), b 16×8 (column), bf16; d 16×8 fp32.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One tile's key rows into shared memory: rows [0, valid) from `rows` (one
// pointer per 64-row tile start, row stride `stride` elements), zeros after.
__device__ __forceinline__ void load_tile(char* tile, const __nv_bfloat16* first_row, int64_t stride, int lo, int hi) {
  for (int i = threadIdx.x; i < kKeysPerTile * kChunks; i += kWarps * 32) {
    const int row = i / kChunks, chunk = i % kChunks;
    const bool valid = row >= lo && row < hi;
    const __nv_bfloat16* src = valid ? first_row + row * stride + chunk * 8 : first_row;
    copy_async(tile + swizzled(row, chunk) * 16, src, valid ? 16 : 0);
  }
}

__global__ void __launch_bounds__(kWarps * 32)
block_attention_forward_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                               const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out,
                               float* __restrict__ lse, const __nv_bfloat16* __restrict__ prior_out,
                               const float* __restrict__ prior_lse, const BlockKeys* __restrict__ blocks, int heads,
                               int kv_heads, float scale) {
  extern __shared__ __align__(128) char shared[];
  const int block = blockIdx.x, kv = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = kv * (heads / kv_heads) + warp;
  const int g = lane / 4, t = lane % 4;  // the fragments' row group and column pair
  const BlockKeys b = blocks[block];
  const int64_t q_stride = static_cast<int64_t>(heads) * kHeadDim, kv_stride = static_cast<int64_t>(kv_heads) * kHeadDim;

  // The warp's 16 query rows as A fragments, one per 16 columns of d.
  uint32_t qa[kHeadDim / 16][4];
  {
    const __nv_bfloat16* q0 = q + (b.query_row + g) * q_stride + head * kHeadDim;
    const __nv_bfloat16* q8 = q0 + 8 * q_stride;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const int c = kk * 16 + 2 * t;
      qa[kk][0] = *reinterpret_cast<const uint32_t*>(q0 + c);
      qa[kk][1] = *reinterpret_cast<const uint32_t*>(q8 + c);
      qa[kk][2] = *reinterpret_cast<const uint32_t*>(q0 + c + 8);
      qa[kk][3] = *reinterpret_cast<const uint32_t*>(q8 + c + 8);
    }
  }

  // Tiles: the context's, from the document's start rounded down to a tile,
  // then one of the block's own slots. The dQ pass walks them the same way,
  // written out there too: as one shared device struct the walk cost this
  // kernel 18 registers (186 against 168 with nvcc 13.0, sm_90), two thread
  // blocks per SM instead of three.
  const int64_t context_first = b.context_begin - b.context_begin % kKeysPerTile;
  const int context_tiles =
      b.context_end > b.context_begin ? static_cast<int>((b.context_end - context_first + kKeysPerTile - 1) / kKeysPerTile) : 0;
  const int tiles = context_tiles + 1;
  auto tile_rows = [&](int tile, int& lo, int& hi) -> const __nv_bfloat16* {
    if (tile < context_tiles) {
      const int64_t p0 = context_first + static_cast<int64_t>(tile) * kKeysPerTile;
      lo = static_cast<int>(b.context_begin > p0 ? b.context_begin - p0 : 0);
      hi = static_cast<int>(b.context_end - p0 < kKeysPerTile ? b.context_end - p0 : kKeysPerTile);
      return k + (b.key_row + p0) * kv_stride + kv * kHeadDim;  // k; v at the same offset
    }
    lo = 0, hi = static_cast<int>(b.slot_count);
    return k + b.slot_row * kv_stride + kv * kHeadDim;
  };
  auto load = [&](int tile, int stage) {
    int lo, hi;
    const __nv_bfloat16* kr = tile_rows(tile, lo, hi);
    const __nv_bfloat16* vr = v + (kr - k);
    char* kt = shared + stage * 2 * kTileBytes;
    load_tile(kt, kr, kv_stride, lo, hi);
    load_tile(kt + kTileBytes, vr, kv_stride, lo, hi);
    commit_copies();
  };

  float o[kHeadDim / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // rows g and g + 8, log2 domain
  const float scale_log2 = scale * 1.4426950408889634f;

  load(0, 0);
  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile + 1 < tiles) {
      load(tile + 1, (tile + 1) % kStages);
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    int lo, hi;
    tile_rows(tile, lo, hi);
    const char* kt = shared + stage * 2 * kTileBytes;
    const char* vt = kt + kTileBytes;

    // S = q kᵀ over the tile's 8 column groups of 8 keys (those holding valid keys).
    float s[kKeysPerTile / 8][4] = {};
    const int first_group = lo / 16, last_group = (hi + 15) / 16;  // pairs of 8-key columns
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
#pragma unroll
      for (int pair = 0; pair < kKeysPerTile / 16; ++pair) {
        if (pair < first_group || pair >= last_group) continue;
        const int m = lane / 8, r = lane % 8;
        uint32_t bk[4];
        load_matrices(bk, kt + swizzled(pair * 16 + (m / 2) * 8 + r, kk * 2 + (m % 2)) * 16);
        mma(s[2 * pair], qa[kk], bk[0], bk[1]);
        mma(s[2 * pair + 1], qa[kk], bk[2], bk[3]);
      }
    }
    // Mask the keys outside [lo, hi), then the online softmax.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n * 8 + 2 * t + (e % 2);
        s[n][e] = key >= lo && key < hi ? s[n][e] * scale_log2 : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[n][e]);
      }
    float correction[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffff, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffff, tile_max[i], 2));
      const float new_max = fmaxf(row_max[i], tile_max[i]);
      correction[i] = row_max[i] == -INFINITY ? 0.f : exp2f(row_max[i] - new_max);
      row_max[i] = new_max;
      row_sum[i] *= correction[i];
    }
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= correction[e / 2];
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = s[n][e] == -INFINITY ? 0.f : exp2f(s[n][e] - row_max[e / 2]);
        row_sum[e / 2] += s[n][e];
      }
    // o += p v, p as A fragments straight from the accumulators.
#pragma unroll
    for (int ks = 0; ks < kKeysPerTile / 16; ++ks) {
      if (ks < first_group || ks >= last_group) continue;
      const uint32_t pa[4] = {pack_bf16(s[2 * ks][0], s[2 * ks][1]), pack_bf16(s[2 * ks][2], s[2 * ks][3]),
                              pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                              pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        const int m = lane / 8, r = lane % 8;
        uint32_t bv[4];
        load_matrices_transposed(bv, vt + swizzled(ks * 16 + (m % 2) * 8 + r, dp * 2 + m / 2) * 16);
        mma(o[2 * dp], pa, bv[0], bv[1]);
        mma(o[2 * dp + 1], pa, bv[2], bv[3]);
      }
    }
    __syncthreads();  // the stage is loaded again two tiles on
  }

  // Normalise, write the rows and their log-sum-exp (natural log).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_sum[i] += __shfl_xor_sync(0xffffffff, row_sum[i], 1);
    row_sum[i] += __shfl_xor_sync(0xffffffff, row_sum[i], 2);
  }
  // With a prior, each row's two parts weighted by their share of the
  // merged denominator: w = exp(lse_part − lse_merged).
  constexpr float kLn2 = 0.6931471805599453f;
  float row_lse[2], own_weight[2], prior_weight[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float own = (row_max[i] + log2f(row_sum[i])) * kLn2;
    const float prior = prior_lse ? prior_lse[(b.query_row + g + 8 * i) * heads + head] : -INFINITY;
    if (prior == -INFINITY) {
      row_lse[i] = own, own_weight[i] = 1.f / row_sum[i], prior_weight[i] = 0.f;
    } else {
      const float high = fmaxf(own, prior);
      row_lse[i] = high + log1pf(expf(fminf(own, prior) - high));
      own_weight[i] = expf(own - row_lse[i]) / row_sum[i], prior_weight[i] = expf(prior - row_lse[i]);
    }
  }
  const int64_t at0 = (b.query_row + g) * q_stride + head * kHeadDim, at8 = at0 + 8 * q_stride;
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) {
    const int c = n * 8 + 2 * t;
    float v0 = o[n][0] * own_weight[0], v1 = o[n][1] * own_weight[0];
    float v2 = o[n][2] * own_weight[1], v3 = o[n][3] * own_weight[1];
    if (prior_weight[0] != 0.f) {
      const float2 p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(prior_out + at0 + c));
      v0 += p.x * prior_weight[0], v1 += p.y * prior_weight[0];
    }
    if (prior_weight[1] != 0.f) {
      const float2 p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(prior_out + at8 + c));
      v2 += p.x * prior_weight[1], v3 += p.y * prior_weight[1];
    }
    *reinterpret_cast<uint32_t*>(out + at0 + c) = pack_bf16(v0, v1);
    *reinterpret_cast<uint32_t*>(out + at8 + c) = pack_bf16(v2, v3);
  }
  if (t == 0) {
    lse[(b.query_row + g) * heads + head] = row_lse[0];
    lse[(b.query_row + g + 8) * heads + head] = row_lse[1];
  }
}

// delta[row, head] = Σ_d grad_out · out (fp32): softmax's backward term.
// One warp per (row, head), 4 elements a lane.
__global__ void block_attention_delta_kernel(const __nv_bfloat16* __restrict__ out,
                                             const __nv_bfloat16* __restrict__ grad_out, float* __restrict__ delta,
                                             int64_t vectors) {
  const int64_t vector = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (vector >= vectors) return;
  const int lane = threadIdx.x % 32;
  const __nv_bfloat16* o = out + vector * kHeadDim + lane * 4;
  const __nv_bfloat16* g = grad_out + vector * kHeadDim + lane * 4;
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) sum += __bfloat162float(o[i]) * __bfloat162float(g[i]);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (lane == 0) delta[vector] = sum;
}

// The 64 query rows of a block (4 heads × 16 slots: row i is head
// kv·4 + i/16, slot i%16) into a [64][128] swizzled tile.
__device__ __forceinline__ void load_block_rows(char* tile, const __nv_bfloat16* rows, int64_t query_row, int64_t stride,
                                                int first_head) {
  for (int i = threadIdx.x; i < kKeysPerTile * kChunks; i += kWarps * 32) {
    const int row = i / kChunks, chunk = i % kChunks;
    const __nv_bfloat16* src = rows + (query_row + row % kSlots) * stride + (first_head + row / kSlots) * kHeadDim + chunk * 8;
    copy_async(tile + swizzled(row, chunk) * 16, src, 16);
  }
}

// A [64 rows][64 keys] bf16 tile (P or dS): 8 chunks a row, swizzled likewise.
constexpr int kScoreChunks = kKeysPerTile / 8;
__device__ __forceinline__ int score_swizzled(int row, int chunk) { return row * kScoreChunks + (chunk ^ (row & 7)); }
constexpr int kScoreBytes = kKeysPerTile * kKeysPerTile * 2;

// Key-parallel pass: dK and dV of one 64-key tile and one KV head, summed
// over every block that sees the tile (each block's 64 query rows in turn),
// written once; no atomics. Warp w owns keys 16w … 16w + 15 of dK and dV.
constexpr int kKeyPassShared = 2 * kTileBytes /* K, V */ + 2 * kTileBytes /* q, dO rows */ + 2 * kScoreBytes /* P, dS */ +
                               2 * kKeysPerTile * 4 /* lse, delta */;

__global__ void __launch_bounds__(kWarps * 32)
block_attention_key_pass_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                const __nv_bfloat16* __restrict__ v, const __nv_bfloat16* __restrict__ grad_out,
                                const float* __restrict__ lse, const float* __restrict__ delta,
                                __nv_bfloat16* __restrict__ grad_k, __nv_bfloat16* __restrict__ grad_v,
                                const BlockKeys* __restrict__ blocks, const KeyTile* __restrict__ tiles, int heads,
                                int kv_heads, float scale) {
  extern __shared__ __align__(128) char shared[];
  char* k_tile = shared;
  char* v_tile = k_tile + kTileBytes;
  char* q_tile = v_tile + kTileBytes;
  char* do_tile = q_tile + kTileBytes;
  char* p_tile = do_tile + kTileBytes;
  char* ds_tile = p_tile + kScoreBytes;
  float* lse_rows = reinterpret_cast<float*>(ds_tile + kScoreBytes);
  float* delta_rows = lse_rows + kKeysPerTile;
  const KeyTile tile = tiles[blockIdx.x];
  const int kv = blockIdx.y, first_head = kv * (heads / kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t q_stride = static_cast<int64_t>(heads) * kHeadDim, kv_stride = static_cast<int64_t>(kv_heads) * kHeadDim;
  const float scale_log2 = scale * 1.4426950408889634f;

  load_tile(k_tile, k + tile.key_row * kv_stride + kv * kHeadDim, kv_stride, tile.lo, tile.hi);
  load_tile(v_tile, v + tile.key_row * kv_stride + kv * kHeadDim, kv_stride, tile.lo, tile.hi);
  commit_copies();

  float dk[kHeadDim / 8][4] = {}, dv[kHeadDim / 8][4] = {};
  for (int block = tile.first_block; block < tile.last_block; ++block) {
    const BlockKeys b = blocks[block];
    load_block_rows(q_tile, q, b.query_row, q_stride, first_head);
    load_block_rows(do_tile, grad_out, b.query_row, q_stride, first_head);
    commit_copies();
    for (int i = threadIdx.x; i < kKeysPerTile; i += kWarps * 32) {
      const int64_t at = (b.query_row + i % kSlots) * heads + first_head + i / kSlots;
      lse_rows[i] = lse[at] * 1.4426950408889634f;  // log2 domain
      delta_rows[i] = delta[at];
    }
    // The keys of the tile this block sees.
    int lo = tile.lo, hi = tile.hi;
    if (tile.position0 >= 0) {
      const int64_t begin = b.context_begin - tile.position0, end = b.context_end - tile.position0;
      lo = max(lo, static_cast<int>(begin < 0 ? 0 : begin > kKeysPerTile ? kKeysPerTile : begin));
      hi = min(hi, static_cast<int>(end < 0 ? 0 : end > kKeysPerTile ? kKeysPerTile : end));
    }
    wait_copies<0>();
    __syncthreads();
    // Warp w: its head's 16 rows against the tile's 64 keys, 16 at a time:
    // S = q kᵀ, P = exp(S − lse), dP = dO vᵀ, dS = P (dP − delta), into
    // shared memory as bf16.
    const int m = lane / 8, r = lane % 8;
#pragma unroll
    for (int pair = 0; pair < kKeysPerTile / 16; ++pair) {
      float s[2][4] = {}, dp[2][4] = {};
      if (pair * 16 < hi && pair * 16 + 16 > lo) {
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          uint32_t a[4], bk[4];
          load_matrices(a, q_tile + swizzled(warp * 16 + (m % 2) * 8 + r, kk * 2 + m / 2) * 16);
          load_matrices(bk, k_tile + swizzled(pair * 16 + (m / 2) * 8 + r, kk * 2 + (m % 2)) * 16);
          mma(s[0], a, bk[0], bk[1]);
          mma(s[1], a, bk[2], bk[3]);
          load_matrices(a, do_tile + swizzled(warp * 16 + (m % 2) * 8 + r, kk * 2 + m / 2) * 16);
          load_matrices(bk, v_tile + swizzled(pair * 16 + (m / 2) * 8 + r, kk * 2 + (m % 2)) * 16);
          mma(dp[0], a, bk[0], bk[1]);
          mma(dp[1], a, bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        float p[4], ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = warp * 16 + g + 8 * (e / 2), key = pair * 16 + n * 8 + 2 * t + (e % 2);
          p[e] = key >= lo && key < hi ? exp2f(s[n][e] * scale_log2 - lse_rows[row]) : 0.f;
          ds[e] = p[e] * (dp[n][e] - delta_rows[row]);
        }
        const int chunk = pair * 2 + n;
        const int row0 = warp * 16 + g, row8 = row0 + 8;
        *reinterpret_cast<uint32_t*>(p_tile + score_swizzled(row0, chunk) * 16 + 4 * t) = pack_bf16(p[0], p[1]);
        *reinterpret_cast<uint32_t*>(p_tile + score_swizzled(row8, chunk) * 16 + 4 * t) = pack_bf16(p[2], p[3]);
        *reinterpret_cast<uint32_t*>(ds_tile + score_swizzled(row0, chunk) * 16 + 4 * t) = pack_bf16(ds[0], ds[1]);
        *reinterpret_cast<uint32_t*>(ds_tile + score_swizzled(row8, chunk) * 16 + 4 * t) = pack_bf16(ds[2], ds[3]);
      }
    }
    __syncthreads();
    // Warp w: its 16 keys, over the block's 64 rows: dV += Pᵀ dO, dK += dSᵀ q.
    if (warp * 16 < hi && warp * 16 + 16 > lo) {
#pragma unroll
      for (int ks = 0; ks < kKeysPerTile / 16; ++ks) {
        uint32_t pa[4], sa[4];
        const int row = ks * 16 + (m / 2) * 8 + r, chunk = warp * 2 + (m % 2);
        load_matrices_transposed(pa, p_tile + score_swizzled(row, chunk) * 16);
        load_matrices_transposed(sa, ds_tile + score_swizzled(row, chunk) * 16);
#pragma unroll
        for (int dpair = 0; dpair < kHeadDim / 16; ++dpair) {
          uint32_t bo[4], bq[4];
          load_matrices_transposed(bo, do_tile + swizzled(ks * 16 + (m % 2) * 8 + r, dpair * 2 + m / 2) * 16);
          load_matrices_transposed(bq, q_tile + swizzled(ks * 16 + (m % 2) * 8 + r, dpair * 2 + m / 2) * 16);
          mma(dv[2 * dpair], pa, bo[0], bo[1]);
          mma(dv[2 * dpair + 1], pa, bo[2], bo[3]);
          mma(dk[2 * dpair], sa, bq[0], bq[1]);
          mma(dk[2 * dpair + 1], sa, bq[2], bq[3]);
        }
      }
    }
    __syncthreads();  // the rows' tiles are loaded again for the next block
  }
  // The warp's 16 keys: rows g and g + 8 of its C fragments.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = warp * 16 + g + 8 * half;
    if (key < tile.lo || key >= tile.hi) continue;
    __nv_bfloat16* dk_row = grad_k + (tile.key_row + key) * kv_stride + kv * kHeadDim;
    __nv_bfloat16* dv_row = grad_v + (tile.key_row + key) * kv_stride + kv * kHeadDim;
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      const int c = n * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dk_row + c) = pack_bf16(dk[n][2 * half] * scale, dk[n][2 * half + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv_row + c) = pack_bf16(dv[n][2 * half], dv[n][2 * half + 1]);
    }
  }
}

// Query-parallel pass: dQ of one block's 64 rows (as the forward: one
// thread block per block and KV head, over its key tiles), dQ = Σ dS k · scale.
__global__ void __launch_bounds__(kWarps * 32)
block_attention_query_pass_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                  const __nv_bfloat16* __restrict__ v, const __nv_bfloat16* __restrict__ grad_out,
                                  const float* __restrict__ lse, const float* __restrict__ delta,
                                  __nv_bfloat16* __restrict__ grad_q, const BlockKeys* __restrict__ blocks, int heads,
                                  int kv_heads, float scale) {
  extern __shared__ __align__(128) char shared[];
  const int block = blockIdx.x, kv = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = kv * (heads / kv_heads) + warp;
  const int g = lane / 4, t = lane % 4;
  const BlockKeys b = blocks[block];
  const int64_t q_stride = static_cast<int64_t>(heads) * kHeadDim, kv_stride = static_cast<int64_t>(kv_heads) * kHeadDim;
  const float scale_log2 = scale * 1.4426950408889634f;

  // The warp's q and dO rows as A fragments; its rows' lse (log2) and delta.
  uint32_t qa[kHeadDim / 16][4], oa[kHeadDim / 16][4];
  {
    const __nv_bfloat16* q0 = q + (b.query_row + g) * q_stride + head * kHeadDim;
    const __nv_bfloat16* o0 = grad_out + (b.query_row + g) * q_stride + head * kHeadDim;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const int c = kk * 16 + 2 * t;
      qa[kk][0] = *reinterpret_cast<const uint32_t*>(q0 + c);
      qa[kk][1] = *reinterpret_cast<const uint32_t*>(q0 + 8 * q_stride + c);
      qa[kk][2] = *reinterpret_cast<const uint32_t*>(q0 + c + 8);
      qa[kk][3] = *reinterpret_cast<const uint32_t*>(q0 + 8 * q_stride + c + 8);
      oa[kk][0] = *reinterpret_cast<const uint32_t*>(o0 + c);
      oa[kk][1] = *reinterpret_cast<const uint32_t*>(o0 + 8 * q_stride + c);
      oa[kk][2] = *reinterpret_cast<const uint32_t*>(o0 + c + 8);
      oa[kk][3] = *reinterpret_cast<const uint32_t*>(o0 + 8 * q_stride + c + 8);
    }
  }
  const float lse0 = lse[(b.query_row + g) * heads + head] * 1.4426950408889634f;
  const float lse8 = lse[(b.query_row + g + 8) * heads + head] * 1.4426950408889634f;
  const float delta0 = delta[(b.query_row + g) * heads + head], delta8 = delta[(b.query_row + g + 8) * heads + head];

  const int64_t context_first = b.context_begin - b.context_begin % kKeysPerTile;
  const int context_tiles = b.context_end > b.context_begin
                                ? static_cast<int>((b.context_end - context_first + kKeysPerTile - 1) / kKeysPerTile)
                                : 0;
  const int tiles = context_tiles + 1;
  auto tile_rows = [&](int tile, int& lo, int& hi) -> int64_t {  // the tile's first k row
    if (tile < context_tiles) {
      const int64_t p0 = context_first + static_cast<int64_t>(tile) * kKeysPerTile;
      lo = static_cast<int>(b.context_begin > p0 ? b.context_begin - p0 : 0);
      hi = static_cast<int>(b.context_end - p0 < kKeysPerTile ? b.context_end - p0 : kKeysPerTile);
      return b.key_row + p0;
    }
    lo = 0, hi = static_cast<int>(b.slot_count);
    return b.slot_row;
  };
  auto load = [&](int tile, int stage) {
    int lo, hi;
    const int64_t row = tile_rows(tile, lo, hi);
    char* kt = shared + stage * 2 * kTileBytes;
    load_tile(kt, k + row * kv_stride + kv * kHeadDim, kv_stride, lo, hi);
    load_tile(kt + kTileBytes, v + row * kv_stride + kv * kHeadDim, kv_stride, lo, hi);
    commit_copies();
  };

  float dq[kHeadDim / 8][4] = {};
  load(0, 0);
  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile + 1 < tiles) {
      load(tile + 1, (tile + 1) % kStages);
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();
    int lo, hi;
    tile_rows(tile, lo, hi);
    const char* kt = shared + stage * 2 * kTileBytes;
    const char* vt = kt + kTileBytes;
    const int m = lane / 8, r = lane % 8;
#pragma unroll
    for (int pair = 0; pair < kKeysPerTile / 16; ++pair) {
      if (pair * 16 >= hi || pair * 16 + 16 <= lo) continue;
      float s[2][4] = {}, dp[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t bk[4], bv[4];
        load_matrices(bk, kt + swizzled(pair * 16 + (m / 2) * 8 + r, kk * 2 + (m % 2)) * 16);
        load_matrices(bv, vt + swizzled(pair * 16 + (m / 2) * 8 + r, kk * 2 + (m % 2)) * 16);
        mma(s[0], qa[kk], bk[0], bk[1]);
        mma(s[1], qa[kk], bk[2], bk[3]);
        mma(dp[0], oa[kk], bv[0], bv[1]);
        mma(dp[1], oa[kk], bv[2], bv[3]);
      }
      // dS for these 16 keys, as the A fragment of dQ += dS k.
      float ds[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = pair * 16 + n * 8 + 2 * t + (e % 2);
          const float p = key >= lo && key < hi ? exp2f(s[n][e] * scale_log2 - (e < 2 ? lse0 : lse8)) : 0.f;
          ds[n][e] = p * (dp[n][e] - (e < 2 ? delta0 : delta8));
        }
      const uint32_t sa[4] = {pack_bf16(ds[0][0], ds[0][1]), pack_bf16(ds[0][2], ds[0][3]), pack_bf16(ds[1][0], ds[1][1]),
                              pack_bf16(ds[1][2], ds[1][3])};
#pragma unroll
      for (int dpair = 0; dpair < kHeadDim / 16; ++dpair) {
        uint32_t bk[4];
        load_matrices_transposed(bk, kt + swizzled(pair * 16 + (m % 2) * 8 + r, dpair * 2 + m / 2) * 16);
        mma(dq[2 * dpair], sa, bk[0], bk[1]);
        mma(dq[2 * dpair + 1], sa, bk[2], bk[3]);
      }
    }
    __syncthreads();
  }
  __nv_bfloat16* d0 = grad_q + (b.query_row + g) * q_stride + head * kHeadDim;
  __nv_bfloat16* d8 = d0 + 8 * q_stride;
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) {
    const int c = n * 8 + 2 * t;
    *reinterpret_cast<uint32_t*>(d0 + c) = pack_bf16(dq[n][0] * scale, dq[n][1] * scale);
    *reinterpret_cast<uint32_t*>(d8 + c) = pack_bf16(dq[n][2] * scale, dq[n][3] * scale);
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

static_assert(sizeof(BlockKeys) == kBlockKeysFields * 8, "BlockKeys is uploaded as int64 [n, 6]");
static_assert(sizeof(KeyTile) == kKeyTileInt64s * 8, "KeyTile is uploaded as int64 [n, 4]");
static_assert(kKeyTileRows == kKeysPerTile && kMaxSlots <= kKeysPerTile, "one tile holds a block's slots");

void block_attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, const void* prior_out,
                             const float* prior_lse, const BlockKeys* blocks, int64_t block_count, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, float scale, CUstream_st* stream) {
  if (head_dim != kHeadDim) throw std::invalid_argument("block_attention_forward: head_dim must be 128");
  if (heads != kWarps * kv_heads) throw std::invalid_argument("block_attention_forward: 4 query heads per KV head");
  if (block_count == 0) return;
  static const cudaError_t opted = cudaFuncSetAttribute(block_attention_forward_kernel,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (opted != cudaSuccess) throw std::runtime_error(std::string("block_attention_forward: ") + cudaGetErrorString(opted));
  const dim3 grid(static_cast<unsigned>(block_count), static_cast<unsigned>(kv_heads));
  block_attention_forward_kernel<<<grid, kWarps * 32, kSharedBytes, stream>>>(
      static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k), static_cast<const __nv_bfloat16*>(v),
      static_cast<__nv_bfloat16*>(out), lse, static_cast<const __nv_bfloat16*>(prior_out), prior_lse, blocks,
      static_cast<int>(heads), static_cast<int>(kv_heads), scale);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess)
    throw std::runtime_error(std::string("block_attention_forward: ") + cudaGetErrorString(launched));
}

void block_attention_backward(const void* q, const void* k, const void* v, const void* out, const void* grad_out,
                              const float* lse, float* delta, void* grad_q, void* grad_k, void* grad_v,
                              const BlockKeys* blocks, int64_t block_count, const KeyTile* tiles, int64_t tile_count,
                              int64_t query_row_count, int64_t key_row_count, int64_t heads, int64_t kv_heads,
                              int64_t head_dim, float scale, CUstream_st* stream) {
  if (head_dim != kHeadDim) throw std::invalid_argument("block_attention_backward: head_dim must be 128");
  if (heads != kWarps * kv_heads) throw std::invalid_argument("block_attention_backward: 4 query heads per KV head");
  const size_t kv_bytes = static_cast<size_t>(key_row_count * kv_heads * kHeadDim) * 2;
  check(cudaMemsetAsync(grad_k, 0, kv_bytes, stream), "block_attention_backward");
  check(cudaMemsetAsync(grad_v, 0, kv_bytes, stream), "block_attention_backward");
  if (block_count == 0) return;
  const int64_t vectors = query_row_count * heads;
  block_attention_delta_kernel<<<static_cast<unsigned>((vectors + 7) / 8), 256, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(grad_out), delta, vectors);
  check(cudaGetLastError(), "block_attention_backward (delta)");
  static const cudaError_t key_opted = cudaFuncSetAttribute(
      block_attention_key_pass_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kKeyPassShared);
  static const cudaError_t query_opted = cudaFuncSetAttribute(
      block_attention_query_pass_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  check(key_opted, "block_attention_backward (key pass)");
  check(query_opted, "block_attention_backward (query pass)");
  const auto* q_ = static_cast<const __nv_bfloat16*>(q);
  const auto* k_ = static_cast<const __nv_bfloat16*>(k);
  const auto* v_ = static_cast<const __nv_bfloat16*>(v);
  const auto* g_ = static_cast<const __nv_bfloat16*>(grad_out);
  if (tile_count > 0) {
    block_attention_key_pass_kernel<<<dim3(static_cast<unsigned>(tile_count), static_cast<unsigned>(kv_heads)),
                                      kWarps * 32, kKeyPassShared, stream>>>(
        q_, k_, v_, g_, lse, delta, static_cast<__nv_bfloat16*>(grad_k), static_cast<__nv_bfloat16*>(grad_v), blocks, tiles,
        static_cast<int>(heads), static_cast<int>(kv_heads), scale);
    check(cudaGetLastError(), "block_attention_backward (key pass)");
  }
  block_attention_query_pass_kernel<<<dim3(static_cast<unsigned>(block_count), static_cast<unsigned>(kv_heads)),
                                      kWarps * 32, kSharedBytes, stream>>>(
      q_, k_, v_, g_, lse, delta, static_cast<__nv_bfloat16*>(grad_q), blocks, static_cast<int>(heads),
      static_cast<int>(kv_heads), scale);
  check(cudaGetLastError(), "block_attention_backward (query pass)");
}

}  // namespace dflash::cuda_kernels
