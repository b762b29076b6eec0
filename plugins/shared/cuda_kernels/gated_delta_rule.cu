#include "gated_delta_rule.h"
#include "device_math.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {
namespace {

constexpr int kChunk = static_cast<int>(kDeltaChunk);
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 16;         // the tensor cores' tile side
constexpr int kFloatLd = 64 + 4;  // fp32 [64, 64] matrices, padded against bank conflicts
constexpr int kHalfLd = 64 + 8;   // 16-bit [·, 64] matrices

__host__ __device__ constexpr int pad16(int64_t d) { return static_cast<int>((d + 15) / 16 * 16); }


// The workspace, 16-bit: for each (chunk, value head) w [64, dkp],
// u [64, dvp] and P [64, 64]; then for each (chunk, key head) q and k
// L2-normalised [64, dkp] (the value heads sharing a key head share them:
// written once); then in fp32, for each (chunk, value head), the cumulative
// log decay gc [64] (its last, the chunk's whole decay).
struct Workspace {
  int64_t w, u, p, per_value;  // elements within one (chunk, value head)'s part, and its size
  int64_t q, k, per_key;       // within one (chunk, key head)'s part
  int64_t keys, decays, bytes; // where the key parts and the decays start (16-bit elements); the size
  int64_t value_heads, key_heads;
};
__host__ __device__ inline Workspace workspace_layout(int64_t chunk_count, int64_t value_heads, int64_t key_heads,
                                                      int dkp, int dvp) {
  Workspace l{};
  l.w = 0;
  l.u = l.w + int64_t{kChunk} * dkp;
  l.p = l.u + int64_t{kChunk} * dvp;
  l.per_value = l.p + int64_t{kChunk} * kChunk;
  l.q = 0;
  l.k = int64_t{kChunk} * dkp;
  l.per_key = 2 * l.k;
  l.keys = chunk_count * value_heads * l.per_value;  // 16-byte aligned: per_value is a multiple of 1024
  l.decays = l.keys + chunk_count * key_heads * l.per_key;
  l.bytes = l.decays * 2 + chunk_count * value_heads * kChunk * 4;
  l.value_heads = value_heads;
  l.key_heads = key_heads;
  return l;
}
template <class T>
__device__ inline T* value_part(T* base, const Workspace& l, int64_t chunk, int64_t head) {
  return base + (chunk * l.value_heads + head) * l.per_value;
}
template <class T>
__device__ inline T* key_part(T* base, const Workspace& l, int64_t chunk, int64_t key_head) {
  return base + l.keys + (chunk * l.key_heads + key_head) * l.per_key;
}
template <class T>
__device__ inline float* chunk_decays(T* base, const Workspace& l, int64_t chunk, int64_t head) {
  return reinterpret_cast<float*>(base + l.decays) + (chunk * l.value_heads + head) * kChunk;
}
template <class T>
__device__ inline const float* chunk_decays(const T* base, const Workspace& l, int64_t chunk, int64_t head) {
  return reinterpret_cast<const float*>(base + l.decays) + (chunk * l.value_heads + head) * kChunk;
}

// gc[i] = Σ_{j ≤ i} g[j] over the chunk's tokens (0 past its length), and
// bt[i] = β (0 past the length). Warp 0 only.
__device__ void chunk_decay(const float* g, const float* beta, int64_t stride, int length, float* gc, float* bt) {
  const int lane = threadIdx.x % 32;
  float lo = lane < length ? g[lane * stride] : 0.f, hi = lane + 32 < length ? g[(lane + 32) * stride] : 0.f;
  for (int offset = 1; offset < 32; offset *= 2) {
    const float a = __shfl_up_sync(0xffffffff, lo, offset), b = __shfl_up_sync(0xffffffff, hi, offset);
    if (lane >= offset) lo += a, hi += b;
  }
  hi += __shfl_sync(0xffffffff, lo, 31);
  gc[lane] = lo;
  gc[lane + 32] = hi;
  bt[lane] = lane < length ? beta[lane * stride] : 0.f;
  bt[lane + 32] = lane + 32 < length ? beta[(lane + 32) * stride] : 0.f;
}

// Where load_rows writes: dst [64, ld] (shared or global memory; null: no
// output there).
template <class T>
struct RowsOut {
  T* dst = nullptr;
  int ld = 0;
};

// Rows i < length of src (token stride `stride`, d ≤ 128 values each),
// L2-normalised and scaled (`normalise`; else as they are), to each of the
// outputs (rounded to T): columns d..dpad and rows past the length are
// zeros. A warp takes 8 rows and issues all their loads before any sum (the
// loads' latency overlaps), 4 values a lane, 8 bytes at once where the rows
// allow.
template <class T, int kOuts>
__device__ void load_rows(const T* src, int64_t stride, int length, int d, int dpad, bool normalise, float scale,
                          const RowsOut<T> (&outs)[kOuts]) {
  constexpr int kRowsPerWarp = kChunk / kWarps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c0 = 4 * lane;  // this lane's four columns
  const bool vector = d % 4 == 0 && stride % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 8 == 0;
  float x[kRowsPerWarp][4];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = warp * kRowsPerWarp + r;
    const T* row = src + i * stride;
    if (vector && i < length && c0 < d) {
      const uint2 raw = *reinterpret_cast<const uint2*>(row + c0);
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) x[r][j] = to_float(v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) x[r][j] = i < length && c0 + j < d ? to_float(row[c0 + j]) : 0.f;
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int i = warp * kRowsPerWarp + r;
    float squares = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) squares += x[r][j] * x[r][j];
    const float norm = normalise ? rsqrtf(warp_sum(squares) + 1e-6f) * scale : scale;
    if (c0 >= dpad) continue;  // dpad is a multiple of 16: a lane's four columns are all in or all out
    Pack<T, 4> packed;
#pragma unroll
    for (int j = 0; j < 4; ++j) packed.v[j] = from_float<T>(x[r][j] * norm);
#pragma unroll
    for (int o = 0; o < kOuts; ++o) {
      if (outs[o].dst == nullptr) continue;
      T* dst = outs[o].dst + i * outs[o].ld + c0;
      if (reinterpret_cast<uintptr_t>(dst) % sizeof(packed) == 0) {
        *reinterpret_cast<Pack<T, 4>*>(dst) = packed;  // one 8-byte store
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[j] = packed.v[j];
      }
    }
  }
}

// ---- cp.async copies and ldmatrix / mma.sync wrappers.
__device__ __forceinline__ void copy_async16(void* dst_shared, const void* src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_shared));
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8 × 8 16-bit matrices from shared memory; lane l gives the address of
// row l % 8 of matrix l / 8. trans: each delivered transposed.
template <bool kTrans>
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* row_address) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row_address));
  if (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// d += a b, a 16 × 16 (row), b 16 × 8 (col), fp32 accumulators.
template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two values rounded to T, packed (the first at the lower address), and back.
template <class T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  Pack<T, 2> p;
  p.v[0] = from_float<T>(x);
  p.v[1] = from_float<T>(y);
  return *reinterpret_cast<const uint32_t*>(&p);
}
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t bits) {
  const Pack<T, 2> p = *reinterpret_cast<const Pack<T, 2>*>(&bits);
  return make_float2(to_float(p.v[0]), to_float(p.v[1]));
}

// ---- The tensor cores' own instructions (mma.sync, operands by ldmatrix),
// whose register layouts are known: results go from the accumulators to
// where they are used without a staging pass. Lane l of a warp holds an
// accumulator's rows g = l / 4 and g + 8, columns t2 = 2 (l % 4) and t2 + 1.

// The A operand (16 × 16) at (row, col) of a 16-bit row-major matrix.
template <class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* m, int ld, int row, int col) {
  const int lane = threadIdx.x % 32;
  load_matrices<false>(a, m + (row + lane % 16) * ld + col + (lane / 16) * 8);
}
// The A operand (16 × 16) at (row, col) of Aᵀ, from a row-major matrix mt
// holding it: A(r, c) = mt[col + c][row + r].
template <class T>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const T* mt, int ld, int row, int col) {
  const int lane = threadIdx.x % 32;
  load_matrices<true>(a, mt + (col + lane % 8 + (lane / 16) * 8) * ld + row + ((lane / 8) % 2) * 8);
}
// The B operands of two column blocks (16 × 16 in all) at (row, col) of a
// row-major [k, n] matrix: b[0], b[1] for columns col..col+7, b[2], b[3] for
// col+8..col+15.
template <class T>
__device__ __forceinline__ void load_b2(uint32_t (&b)[4], const T* m, int ld, int row, int col) {
  const int lane = threadIdx.x % 32;
  load_matrices<true>(b, m + (row + lane % 16) * ld + col + (lane / 16) * 8);
}
// The same for B = mᵀ (a product m_a m_bᵀ): B(r, c) = m[col + c][row + r].
template <class T>
__device__ __forceinline__ void load_b2_of_rows(uint32_t (&b)[4], const T* m, int ld, int row, int col) {
  const int lane = threadIdx.x % 32;
  load_matrices<false>(b, m + (col + (lane / 16) * 8 + lane % 8) * ld + row + ((lane / 8) % 2) * 8);
}

// fp32 products on the tensor cores (tf32 operands, m16n8k8), for the
// inverse of the chunk's triangular matrix: 10-bit mantissas, where its
// result is rounded to 7 (bf16) before use.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void mma1688(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The A operand (16 × 8) at (row, col) of a row-major fp32 matrix; the B
// operand (8 × 8) at (row, col) of a row-major fp32 [k, n] matrix.
__device__ __forceinline__ void load_a_tf32(uint32_t (&a)[4], const float* m, int ld, int row, int col) {
  const int lane = threadIdx.x % 32;
  const float* p = m + (row + lane / 4) * ld + col + lane % 4;
  a[0] = to_tf32(p[0]);
  a[1] = to_tf32(p[8 * ld]);
  a[2] = to_tf32(p[4]);
  a[3] = to_tf32(p[8 * ld + 4]);
}
__device__ __forceinline__ void load_b_tf32(uint32_t& b0, uint32_t& b1, const float* m, int ld, int row, int col) {
  const int lane = threadIdx.x % 32;
  const float* p = m + (row + lane % 4) * ld + col + lane / 4;
  b0 = to_tf32(p[0]);
  b1 = to_tf32(p[4 * ld]);
}

// ---- Prepare: one block per (chunk, value head) writes the chunk's
// workspace. 70 KB of shared memory with 128-wide heads: three blocks an SM.
// k (normalised) stays for w; q's region holds v once q kᵀ is done; A is
// fp32 until the inverse is done, then the two column-scaled T in 16 bits.
struct PrepareLayout {
  int dkp, dvp, ld;  // ld: the 16-bit [64, ·] matrices' row stride
  int64_t kn, qn, vr, a, tw, tu, x, gc, bt, w_scale, bytes;  // byte offsets
};
constexpr int64_t kHalfT = int64_t{kChunk} * kHalfLd * 2;  // a 16-bit [64, 64] matrix, padded
__host__ __device__ inline PrepareLayout prepare_layout(int64_t dk, int64_t dv) {
  PrepareLayout l{};
  l.dkp = pad16(dk);
  l.dvp = pad16(dv);
  l.ld = (l.dkp > l.dvp ? l.dkp : l.dvp) + 8;
  const int64_t half_matrix = int64_t{kChunk} * l.ld * 2, float_matrix = int64_t{kChunk} * kFloatLd * 4;
  l.kn = 0;
  l.qn = l.kn + half_matrix;
  l.vr = l.qn;
  l.a = l.qn + half_matrix;
  l.tw = l.a;
  l.tu = l.tw + kHalfT;
  l.x = l.a + (float_matrix > 2 * kHalfT ? float_matrix : 2 * kHalfT);  // T in fp32
  l.gc = l.x + float_matrix;
  l.bt = l.gc + kChunk * 4;
  l.w_scale = l.bt + kChunk * 4;
  l.bytes = l.w_scale + kChunk * 4;
  return l;
}

// Rows i < length of src (d values each, token stride `stride`) into dst
// [64, ld] as they are, zeros past the length and in columns d..dpad, by
// cp.async (one group; the caller waits) where 16-byte pieces line up:
// false where they do not, and nothing copied.
template <class T>
__device__ bool copy_rows_async(const T* src, int64_t stride, int length, int d, int dpad, T* dst, int ld) {
  const bool aligned = d % 8 == 0 && stride % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (!aligned) return false;
  const int pieces = dpad / 8;
  for (int e = threadIdx.x; e < kChunk * pieces; e += kThreads) {
    const int r = e / pieces, c = (e % pieces) * 8;
    const bool valid = r < length && c < d;  // d % 8 == 0: a piece is all in or all out
    copy_async16(dst + r * ld + c, valid ? src + r * stride + c : src, valid);
  }
  copy_async_commit();
  return true;
}

// A = β k kᵀ and P = q kᵀ, both times the decays exp(gc_i − gc_j), on the
// ten 16 × 16 tiles on and below the diagonal (A strictly below it): a warp
// takes a tile's two products at once (k's fragments serve both) and applies
// the decays in its accumulators; A goes to shared memory in fp32 for the
// inverse, P straight to the workspace. P's tiles above the diagonal are
// written as zeros (never read, but no stale values in the workspace).
template <class T>
__device__ void decayed_products(const T* kn, const T* qn, int ld, int k_tiles, const float* gc, const float* bt,
                                 float* A, T* p_out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t2 = (lane % 4) * 2;
  for (int tile = warp; tile < 10; tile += kWarps) {
    int tj = tile, ti = 0;
    while (tj > ti) tj -= ++ti;  // (ti, tj) over the lower tiles of 4 × 4
    float kk_acc[2][4] = {}, qk_acc[2][4] = {};
    for (int kk = 0; kk < k_tiles; ++kk) {
      uint32_t fk[4], fq[4], fb[4];
      load_a(fk, kn, ld, ti * kTile, kk * kTile);
      load_a(fq, qn, ld, ti * kTile, kk * kTile);
      load_b2_of_rows(fb, kn, ld, kk * kTile, tj * kTile);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        mma16816<T>(kk_acc[b], fk, fb[2 * b], fb[2 * b + 1]);
        mma16816<T>(qk_acc[b], fq, fb[2 * b], fb[2 * b + 1]);
      }
    }
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = ti * kTile + g + half * 8, j = tj * kTile + b * 8 + t2;
        const float d0 = i >= j ? expf(gc[i] - gc[j]) : 0.f, d1 = i >= j + 1 ? expf(gc[i] - gc[j + 1]) : 0.f;
        *reinterpret_cast<float2*>(A + i * kFloatLd + j) =
            make_float2(i > j ? bt[i] * kk_acc[b][2 * half] * d0 : 0.f,
                        i > j + 1 ? bt[i] * kk_acc[b][2 * half + 1] * d1 : 0.f);
        *reinterpret_cast<uint32_t*>(p_out + i * kChunk + j) =
            pack2<T>(qk_acc[b][2 * half] * d0, qk_acc[b][2 * half + 1] * d1);
      }
  }
  for (int e = threadIdx.x; e < kChunk * kChunk / 8; e += kThreads) {
    const int i = e / (kChunk / 8), j0 = (e % (kChunk / 8)) * 8;
    if (j0 / kTile > i / kTile) *reinterpret_cast<Pack<T, 8>*>(p_out + i * kChunk + j0) = Pack<T, 8>{};
  }
}

// T = (I + A)⁻¹ (A strictly lower triangular, fp32) into X, by 16 × 16
// blocks. The four diagonal blocks' inverses by forward substitution, a lane
// a column with the column in registers (warps 0 and 1: call this on them);
// then the blocks below, one block row at a time (inverse_below_diagonal).
__device__ void inverse_diagonal_blocks(const float* A, float* X) {
  const int lane = threadIdx.x % 32, c = lane % kTile;
  const int base = (2 * (threadIdx.x / 32) + lane / kTile) * kTile;
  float x[kTile];
#pragma unroll
  for (int i = 0; i < kTile; ++i) {
    const float* a_row = A + (base + i) * kFloatLd + base;
    float even = 0.f, odd = 0.f;  // two chains of sums, in a fixed order
#pragma unroll
    for (int m = 0; m + 1 < i; m += 2) {
      even += a_row[m] * x[m];
      odd += a_row[m + 1] * x[m + 1];
    }
    if (i % 2 == 1) even += a_row[i - 1] * x[i - 1];
    x[i] = i == c ? 1.f : i < c ? 0.f : -(even + odd);
  }
#pragma unroll
  for (int i = 0; i < kTile; ++i) X[(base + i) * kFloatLd + base + c] = x[i];
}

// X_ij = −X_ii Σ_{j ≤ m < i} A_im X_mj for block rows i = 1, 2, 3: three
// dependent stages where substitution over the 64 rows takes 64. At stage
// i, warp w < 2i takes block column w / 2, its 8 columns (w % 2) · 8 …; the
// sum is staged in A's strictly upper first block row (never read).
__device__ void inverse_below_diagonal(float* A, float* X) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t2 = (lane % 4) * 2;
  float* sum = A + kTile + warp * 8;  // [16, 8], row stride kFloatLd
  for (int bi = 1; bi < kChunk / kTile; ++bi) {
    if (warp < 2 * bi) {
      const int j = warp / 2, n0 = j * kTile + (warp % 2) * 8;
      float y[4] = {};
      for (int m = j; m < bi; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t fa[4], b0, b1;
          load_a_tf32(fa, A, kFloatLd, bi * kTile, m * kTile + h * 8);
          load_b_tf32(b0, b1, X, kFloatLd, m * kTile + h * 8, n0);
          mma1688(y, fa, b0, b1);
        }
      *reinterpret_cast<float2*>(sum + g * kFloatLd + t2) = make_float2(y[0], y[1]);
      *reinterpret_cast<float2*>(sum + (g + 8) * kFloatLd + t2) = make_float2(y[2], y[3]);
      __syncwarp();
      float x[4] = {};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t fa[4], b0, b1;
        load_a_tf32(fa, X, kFloatLd, bi * kTile, bi * kTile + h * 8);
        load_b_tf32(b0, b1, sum, kFloatLd, h * 8, 0);
        mma1688(x, fa, b0, b1);
      }
      *reinterpret_cast<float2*>(X + (bi * kTile + g) * kFloatLd + n0 + t2) = make_float2(-x[0], -x[1]);
      *reinterpret_cast<float2*>(X + (bi * kTile + g + 8) * kFloatLd + n0 + t2) = make_float2(-x[2], -x[3]);
      __syncwarp();  // `sum` is read before the next stage writes it
    }
    __syncthreads();
  }
}

// w = T diag(β exp(gc)) k and u = T diag(β) v (the row factors of k and v
// folded into T's columns: k and v stay as they are), 16 × 16 a job,
// straight from the accumulators to the workspace. T is lower triangular,
// so row tile ti reads only k tiles ≤ ti; the jobs are dealt so each warp
// gets every ti in turn.
template <class T>
__device__ void weighted_keys_and_values(const T* Tw, const T* Tu, const T* kn, const T* vr, int ld, int dkp, int dvp,
                                         T* work, const Workspace& ws) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t2 = (lane % 4) * 2;
  const int w_tiles = dkp / kTile, jobs = 4 * (w_tiles + dvp / kTile);
  for (int job = warp; job < jobs; job += kWarps) {
    const int ti = (job + job / kWarps) % 4, tj = job / 4;
    const bool is_w = tj < w_tiles;
    const int col = (is_w ? tj : tj - w_tiles) * kTile;
    float acc[2][4] = {};
    for (int kk = 0; kk <= ti; ++kk) {
      uint32_t fa[4], fb[4];
      load_a(fa, is_w ? Tw : Tu, kHalfLd, ti * kTile, kk * kTile);
      load_b2(fb, is_w ? kn : vr, ld, kk * kTile, col);
      mma16816<T>(acc[0], fa, fb[0], fb[1]);
      mma16816<T>(acc[1], fa, fb[2], fb[3]);
    }
    const int width = is_w ? dkp : dvp;
    T* dst = work + (is_w ? ws.w : ws.u) + (ti * kTile + g) * width + col + t2;
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<uint32_t*>(dst + half * 8 * width + b * 8) = pack2<T>(acc[b][2 * half], acc[b][2 * half + 1]);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads, 3) delta_prepare(DeltaRuleArgs a) {
  const DeltaChunk ch = a.chunks[blockIdx.x];
  const int head = blockIdx.y, warp = threadIdx.x / 32;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int64_t group = a.value_heads / a.key_heads, key_head = head / group;
  const PrepareLayout l = prepare_layout(dk, dv);
  const int dkp = l.dkp, dvp = l.dvp;
  extern __shared__ __align__(128) unsigned char smem[];
  T* kn = reinterpret_cast<T*>(smem + l.kn);
  T* qn = reinterpret_cast<T*>(smem + l.qn);
  T* vr = reinterpret_cast<T*>(smem + l.vr);
  float* A = reinterpret_cast<float*>(smem + l.a);
  float* X = reinterpret_cast<float*>(smem + l.x);
  T* Tw = reinterpret_cast<T*>(smem + l.tw);
  T* Tu = reinterpret_cast<T*>(smem + l.tu);
  float* gc = reinterpret_cast<float*>(smem + l.gc);
  float* bt = reinterpret_cast<float*>(smem + l.bt);
  float* w_scale = reinterpret_cast<float*>(smem + l.w_scale);

  const Workspace ws = workspace_layout(a.chunk_count, a.value_heads, a.key_heads, dkp, dvp);
  T* const base = static_cast<T*>(a.workspace);
  T* work = value_part(base, ws, blockIdx.x, head);
  const int64_t token0 = static_cast<int64_t>(ch.row) * a.seq_len + ch.start;
  const int64_t gate = token0 * a.value_heads + head;
  if (warp == 0) chunk_decay(a.g + gate, a.beta + gate, a.value_heads, ch.length, gc, bt);
  __syncthreads();
  if (threadIdx.x < kChunk) {
    const int i = threadIdx.x;
    w_scale[i] = bt[i] * expf(gc[i]);
    chunk_decays(base, ws, blockIdx.x, head)[i] = gc[i];
  }
  const T* q = static_cast<const T*>(a.q) + ch.row * a.q_stride[0] + ch.start * a.q_stride[1] + key_head * a.q_stride[2];
  const T* k = static_cast<const T*>(a.k) + ch.row * a.k_stride[0] + ch.start * a.k_stride[1] + key_head * a.k_stride[2];
  const T* v = static_cast<const T*>(a.v) + ch.row * a.v_stride[0] + ch.start * a.v_stride[1] + head * a.v_stride[2];
  {
    // The first value head of a key head writes its q and k for all of them.
    T* keys = head % group == 0 ? key_part(base, ws, blockIdx.x, key_head) : nullptr;
    const RowsOut<T> k_outs[2] = {{kn, l.ld}, {keys != nullptr ? keys + ws.k : nullptr, dkp}};
    load_rows(k, a.k_stride[1], ch.length, dk, dkp, true, 1.f, k_outs);
    const RowsOut<T> q_outs[2] = {{qn, l.ld}, {keys != nullptr ? keys + ws.q : nullptr, dkp}};
    load_rows(q, a.q_stride[1], ch.length, dk, dkp, true, rsqrtf(static_cast<float>(dk)), q_outs);
  }
  __syncthreads();
  decayed_products(kn, qn, l.ld, dkp / kTile, gc, bt, A, work + ws.p);
  __syncthreads();  // A whole; q read

  // v into q's region while the inverse runs (through registers where its
  // rows do not line up for cp.async); the diagonal blocks' inverses on two
  // warps.
  const bool v_async = copy_rows_async(v, a.v_stride[1], ch.length, dv, dvp, vr, l.ld);
  if (warp < 2) inverse_diagonal_blocks(A, X);
  if (!v_async) {
    const RowsOut<T> v_outs[1] = {{vr, l.ld}};
    load_rows(v, a.v_stride[1], ch.length, dv, dvp, false, 1.f, v_outs);
  }
  __syncthreads();
  inverse_below_diagonal(A, X);  // ends on a barrier

  // T diag(β exp(gc)) and T diag(β) in 16 bits where A was, zeros above the
  // diagonal blocks.
  for (int e = threadIdx.x; e < kChunk * kChunk / 8; e += kThreads) {
    const int i = e / (kChunk / 8), j0 = (e % (kChunk / 8)) * 8;
    const bool upper = j0 / kTile > i / kTile;
    Pack<T, 8> tw, tu;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const float t = upper ? 0.f : X[i * kFloatLd + j0 + jj];
      tw.v[jj] = from_float<T>(t * w_scale[j0 + jj]);
      tu.v[jj] = from_float<T>(t * bt[j0 + jj]);
    }
    *reinterpret_cast<Pack<T, 8>*>(Tw + i * kHalfLd + j0) = tw;
    *reinterpret_cast<Pack<T, 8>*>(Tu + i * kHalfLd + j0) = tu;
  }
  copy_async_wait<0>();
  __syncthreads();  // T and v whole
  weighted_keys_and_values(Tw, Tu, kn, vr, l.ld, dkp, dvp, work, ws);
}

// The recurrence: one block per (sequence, value head, 64 value columns),
// the column block the fastest grid index (a head's blocks run together and
// share its chunks' workspace in L2). Written with the tensor cores' own
// instructions (mma.sync m16n8k16, operands by ldmatrix), whose register
// layouts are known, so results go from the accumulators to where they are
// used without a staging pass: the fp32 state lives in the warps'
// accumulators (warp w: rows [16w, 16w + 16), all 64 columns) and its 16-bit
// copy, which feeds the products, alternates between two buffers (a chunk
// reads one while the other is written). Each chunk's w, q, k, P and u
// columns are copied to shared memory by cp.async while the chunk before is
// computed (two stages). Two block-wide barriers a chunk.
constexpr int kStateColumns = 64;
constexpr int kColLd = kStateColumns + 8;  // 16-bit [·, 64] matrices, padded
constexpr int kColBlocks = kStateColumns / 8;  // the mma's n = 8 column blocks


struct RecurrenceLayout {
  int dkp, dvp, kld;  // kld: the [64, dkp] matrices' row stride in shared memory
  int64_t w, q, k, p, u, gc, stage;  // byte offsets within a stage, and its size
  int64_t hb, vn, vd, bytes;         // hb: two 16-bit states [dkp, 64 + 8]
};
__host__ __device__ inline RecurrenceLayout recurrence_layout(int64_t dk, int64_t dv) {
  RecurrenceLayout l{};
  l.dkp = pad16(dk);
  l.dvp = pad16(dv);
  l.kld = l.dkp + 8;
  const int64_t key_matrix = int64_t{kChunk} * l.kld * 2, col_matrix = int64_t{kChunk} * kColLd * 2;
  l.w = 0;
  l.q = l.w + key_matrix;
  l.k = l.q + key_matrix;
  l.p = l.k + key_matrix;
  l.u = l.p + col_matrix;  // P [64, 64] and u's 64 columns share the padded width
  l.gc = l.u + col_matrix;
  l.stage = l.gc + kChunk * 4;
  l.hb = 2 * l.stage;
  l.vn = l.hb + 2 * int64_t{l.dkp} * kColLd * 2;  // v' [64, 64 + 8]
  l.vd = l.vn + col_matrix;                       // v' ⊙ exp(gc_last − gc), the same
  l.bytes = l.vd + col_matrix;
  return l;
}

// Which 16-byte pieces of a [64, dkp] matrix this thread copies: column
// piece `col` of rows first_row, first_row + row_step, … where the row's
// pieces divide the block's threads (dkp = 16, 32, 64 or 128: the index
// arithmetic is done once); else every kThreads-th piece (`even` false).
struct KeyPieces {
  bool even;
  int col, first_row, row_step, per_row;
};
__device__ inline KeyPieces key_pieces(int dkp) {
  const int per_row = dkp / 8;
  if (kThreads % per_row != 0) return {false, 0, 0, 0, per_row};
  return {true, (static_cast<int>(threadIdx.x) % per_row) * 8, static_cast<int>(threadIdx.x) / per_row,
          kThreads / per_row, per_row};
}

// Chunk `chunk`'s w, P, this block's u columns, q, k and decays into one
// stage, 16 bytes a copy, as one cp.async group.
template <class T>
__device__ void stage_chunk(const T* base, const Workspace& ws, const RecurrenceLayout& l, const KeyPieces& kp,
                            int64_t chunk, int64_t head, int64_t key_head, int col0, unsigned char* stage) {
  const T* work = value_part(base, ws, chunk, head);
  const T* keys = key_part(base, ws, chunk, key_head);
  const T* const from[3] = {work + ws.w, keys + ws.q, keys + ws.k};
  T* const to[3] = {reinterpret_cast<T*>(stage + l.w), reinterpret_cast<T*>(stage + l.q),
                    reinterpret_cast<T*>(stage + l.k)};
  if (kp.even) {
#pragma unroll
    for (int m = 0; m < 3; ++m)
      for (int r = kp.first_row; r < kChunk; r += kp.row_step)
        copy_async16(to[m] + r * l.kld + kp.col, from[m] + r * l.dkp + kp.col, true);
  } else {
    for (int e = threadIdx.x; e < 3 * kChunk * kp.per_row; e += kThreads) {
      const int m = e / (kChunk * kp.per_row), r = (e / kp.per_row) % kChunk, c = (e % kp.per_row) * 8;
      copy_async16((m == 0 ? to[0] : m == 1 ? to[1] : to[2]) + r * l.kld + c,
                   (m == 0 ? from[0] : m == 1 ? from[1] : from[2]) + r * l.dkp + c, true);
    }
  }
  constexpr int kColPieces = kStateColumns / 8;
  for (int e = threadIdx.x; e < 2 * kChunk * kColPieces; e += kThreads) {
    const bool is_p = e < kChunk * kColPieces;
    const int r = (e / kColPieces) % kChunk, c = (e % kColPieces) * 8;
    const bool valid = is_p || col0 + c < l.dvp;  // u's padding columns past dvp: zeros
    const int64_t at = is_p ? ws.p + int64_t{r} * kChunk + c : ws.u + int64_t{r} * l.dvp + (valid ? col0 + c : 0);
    copy_async16(reinterpret_cast<T*>(stage + (is_p ? l.p : l.u)) + r * kColLd + c, work + at, valid);
  }
  if (threadIdx.x < kChunk / 4)  // 4 floats a copy
    copy_async16(stage + l.gc + threadIdx.x * 16, chunk_decays(base, ws, chunk, head) + threadIdx.x * 4, true);
  copy_async_commit();
}

template <class T>
__global__ void __launch_bounds__(kThreads, 1) delta_recurrence(DeltaRuleArgs a) {
  const DeltaSequence sq = a.sequences[blockIdx.y];
  const int head = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t2 = (lane % 4) * 2;  // an accumulator's rows g, g + 8 and columns t2, t2 + 1
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int col0 = blockIdx.x * kStateColumns, cols = min(kStateColumns, dv - col0);
  const RecurrenceLayout l = recurrence_layout(dk, dv);
  const int dkp = l.dkp, dvp = l.dvp, k_tiles = dkp / kTile, kld = l.kld;
  const Workspace ws = workspace_layout(a.chunk_count, a.value_heads, a.key_heads, dkp, dvp);
  const int64_t key_head = head / (a.value_heads / a.key_heads);
  extern __shared__ __align__(128) unsigned char smem[];
  T* const hb = reinterpret_cast<T*>(smem + l.hb);  // buffer i at hb + i · dkp · kColLd
  T* Vn = reinterpret_cast<T*>(smem + l.vn);
  T* Vd = reinterpret_cast<T*>(smem + l.vd);
  const bool holds_state = warp < k_tiles;  // warp w: state rows [16w, 16w + 16)
  const int srow = warp * kTile;
  // The 64 × 64 products: warp w takes row tile w / 2, column blocks 4 (w % 2) … + 3.
  const int orow = (warp / 2) * kTile, ocol = (warp % 2) * 32;

  const T* base = static_cast<const T*>(a.workspace);
  const KeyPieces kp = key_pieces(dkp);
  if (sq.chunk_count > 0) stage_chunk(base, ws, l, kp, sq.first_chunk, head, key_head, col0, smem);

  const int64_t state0 = (static_cast<int64_t>(sq.row) * a.value_heads + head) * dk * dv;
  const bool from_initial = (sq.flags & kSequenceFromInitial) != 0 && a.initial != nullptr;
  float h[kColBlocks][4];
#pragma unroll
  for (int b = 0; b < kColBlocks; ++b)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = srow + g + (e / 2) * 8, c = b * 8 + t2 + e % 2;
      h[b][e] = holds_state && from_initial && r < dk && c < cols ? a.initial[state0 + static_cast<int64_t>(r) * dv + col0 + c]
                                                                  : 0.f;
    }
  // The 16-bit copy of this warp's state rows into `to`.
  auto publish = [&](T* to) {
#pragma unroll
    for (int b = 0; b < kColBlocks; ++b) {
      *reinterpret_cast<uint32_t*>(to + (srow + g) * kColLd + b * 8 + t2) = pack2<T>(h[b][0], h[b][1]);
      *reinterpret_cast<uint32_t*>(to + (srow + g + 8) * kColLd + b * 8 + t2) = pack2<T>(h[b][2], h[b][3]);
    }
  };
  if (holds_state) publish(hb);

  for (int n = 0; n < sq.chunk_count; ++n) {
    const int64_t chunk_index = sq.first_chunk + n;
    const DeltaChunk ch = a.chunks[chunk_index];
    const unsigned char* stage = smem + (n % 2) * l.stage;
    const T* Hb = hb + (n % 2) * dkp * kColLd;
    copy_async_wait<0>();
    __syncthreads();  // this chunk's stage and Hb whole; the other stage, Vn and Vd free
    if (n + 1 < sq.chunk_count)
      stage_chunk(base, ws, l, kp, chunk_index + 1, head, key_head, col0, smem + ((n + 1) % 2) * l.stage);
    const float* gc = reinterpret_cast<const float*>(stage + l.gc);
    const float last = gc[kChunk - 1];
    const T* W = reinterpret_cast<const T*>(stage + l.w);
    const T* Q = reinterpret_cast<const T*>(stage + l.q);
    const T* K = reinterpret_cast<const T*>(stage + l.k);
    const T* P = reinterpret_cast<const T*>(stage + l.p);
    const T* U = reinterpret_cast<const T*>(stage + l.u);

    // One pass over H for both of its products: v' = u − w H, this warp's
    // 16 × 32, into Vn, and times exp(gc_last − gc) (k's decay to the
    // chunk's end, folded into v' for k's product) into Vd; and q H, the
    // first part of o = exp(gc) ⊙ (q H) + P v' (q's decay from the chunk's
    // start applied to its rows), kept in o's accumulators.
    float o[4][4] = {};
    {
      float acc[4][4] = {};
      for (int kk = 0; kk < k_tiles; ++kk) {
        uint32_t fw[4], fq[4], fb[2][4];
        load_a(fw, W, kld, orow, kk * kTile);
        load_a(fq, Q, kld, orow, kk * kTile);
        load_b2(fb[0], Hb, kColLd, kk * kTile, ocol);
        load_b2(fb[1], Hb, kColLd, kk * kTile, ocol + 16);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          mma16816<T>(acc[b], fw, fb[b / 2][(b % 2) * 2], fb[b / 2][(b % 2) * 2 + 1]);
          mma16816<T>(o[b], fq, fb[b / 2][(b % 2) * 2], fb[b / 2][(b % 2) * 2 + 1]);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = orow + g + half * 8;
        const float to_end = expf(last - gc[i]), from_start = expf(gc[i]);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int c = ocol + b * 8 + t2;
          const float2 u = unpack2<T>(*reinterpret_cast<const uint32_t*>(U + i * kColLd + c));
          const float x = u.x - acc[b][half * 2], y = u.y - acc[b][half * 2 + 1];
          *reinterpret_cast<uint32_t*>(Vn + i * kColLd + c) = pack2<T>(x, y);
          *reinterpret_cast<uint32_t*>(Vd + i * kColLd + c) = pack2<T>(x * to_end, y * to_end);
          o[b][half * 2] *= from_start;
          o[b][half * 2 + 1] *= from_start;
        }
      }
    }
    __syncthreads();  // Vn and Vd whole
    {
      for (int kk = 0; kk * kTile <= orow; ++kk) {
        uint32_t fa[4], fb[2][4];
        load_a(fa, P, kColLd, orow, kk * kTile);
        load_b2(fb[0], Vn, kColLd, kk * kTile, ocol);
        load_b2(fb[1], Vn, kColLd, kk * kTile, ocol + 16);
#pragma unroll
        for (int b = 0; b < 4; ++b) mma16816<T>(o[b], fa, fb[b / 2][(b % 2) * 2], fb[b / 2][(b % 2) * 2 + 1]);
      }
      T* out = static_cast<T*>(a.out) + ((static_cast<int64_t>(ch.row) * a.seq_len + ch.start) * a.value_heads + head) * dv + col0;
      const int64_t row_stride = a.value_heads * dv;
      const bool pairs = dv % 2 == 0;  // two values a 4-byte store
#pragma unroll
      for (int b = 0; b < 4; ++b)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = orow + g + half * 8, c = ocol + b * 8 + t2;
          if (i >= ch.length || c >= cols) continue;
          T* at = out + i * row_stride + c;
          const float x = o[b][half * 2], y = o[b][half * 2 + 1];
          if (pairs && c + 1 < cols) {
            *reinterpret_cast<uint32_t*>(at) = pack2<T>(x, y);
          } else {
            at[0] = from_float<T>(x);
            if (c + 1 < cols) at[1] = from_float<T>(y);
          }
        }
    }
    // H ← exp(gc_last) H + kᵀ (v' ⊙ exp(gc_last − gc)), published into the
    // other buffer (nothing reads it this chunk).
    if (holds_state) {
      const float carry = expf(last);
#pragma unroll
      for (int b = 0; b < kColBlocks; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) h[b][e] *= carry;
#pragma unroll
      for (int kk = 0; kk < kChunk / kTile; ++kk) {
        uint32_t fa[4];
        load_a_transposed(fa, K, kld, srow, kk * kTile);
#pragma unroll
        for (int pair = 0; pair < kColBlocks / 2; ++pair) {
          uint32_t fb[4];
          load_b2(fb, Vd, kColLd, kk * kTile, pair * 16);
          mma16816<T>(h[2 * pair], fa, fb[0], fb[1]);
          mma16816<T>(h[2 * pair + 1], fa, fb[2], fb[3]);
        }
      }
      publish(hb + ((n + 1) % 2) * dkp * kColLd);
    }
  }
  if ((sq.flags & kSequenceWritesFinal) != 0 && a.final_state != nullptr && holds_state) {
#pragma unroll
    for (int b = 0; b < kColBlocks; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = srow + g + (e / 2) * 8, c = b * 8 + t2 + e % 2;
        if (r < dk && c < cols) a.final_state[state0 + static_cast<int64_t>(r) * dv + col0 + c] = h[b][e];
      }
  }
}

// The recurrent form: thread (lane c, warp w) holds column c of the block's
// 32 and state rows [32w, 32w + 32) in registers; column sums over dk go
// through shared memory in warp order (fixed).
constexpr int kRecurrentColumns = 32;
constexpr int kRecurrentWarps = 4;            // 4 × 32 state rows: dk ≤ 128
constexpr int kRowsPerThread = kDeltaMaxHeadDim / kRecurrentWarps;

template <class T>
__global__ void __launch_bounds__(kRecurrentWarps * 32) delta_recurrent(DeltaRuleArgs a) {
  const int64_t row = blockIdx.y;
  const int head = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int col = blockIdx.x * kRecurrentColumns + lane;
  const bool live = col < dv;
  const int64_t key_head = head / (a.value_heads / a.key_heads);
  __shared__ float qs[kDeltaMaxHeadDim], ks[kDeltaMaxHeadDim];
  __shared__ float partial[kRecurrentWarps][kRecurrentColumns];
  __shared__ float norms[2][kRecurrentWarps];

  const int64_t state0 = (row * a.value_heads + head) * dk * dv;
  float s[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = warp * kRowsPerThread + r;
    s[r] = a.initial != nullptr && live && i < dk ? a.initial[state0 + static_cast<int64_t>(i) * dv + col] : 0.f;
  }
  const float q_scale = rsqrtf(static_cast<float>(dk));
  for (int64_t t = 0; t < a.seq_len; ++t) {
    // q and k of this token, L2-normalised in fp32 (sums in a fixed order).
    const int i = threadIdx.x;  // 128 threads, dk ≤ 128
    const T* qrow = static_cast<const T*>(a.q) + row * a.q_stride[0] + t * a.q_stride[1] + key_head * a.q_stride[2];
    const T* krow = static_cast<const T*>(a.k) + row * a.k_stride[0] + t * a.k_stride[1] + key_head * a.k_stride[2];
    const float qv = i < dk ? to_float(qrow[i]) : 0.f, kv = i < dk ? to_float(krow[i]) : 0.f;
    const float qsum = warp_sum(qv * qv), ksum = warp_sum(kv * kv);
    if (lane == 0) norms[0][warp] = qsum, norms[1][warp] = ksum;
    __syncthreads();
    float qn = 0.f, kn = 0.f;
#pragma unroll
    for (int w = 0; w < kRecurrentWarps; ++w) qn += norms[0][w], kn += norms[1][w];
    qs[i] = qv * rsqrtf(qn + 1e-6f) * q_scale;
    ks[i] = kv * rsqrtf(kn + 1e-6f);
    const int64_t gate = (row * a.seq_len + t) * a.value_heads + head;
    const float decay = expf(a.g[gate]), beta = a.beta[gate];
    const T* vrow = static_cast<const T*>(a.v) + row * a.v_stride[0] + t * a.v_stride[1] + head * a.v_stride[2];
    const float v = live ? to_float(vrow[col]) : 0.f;
    __syncthreads();  // qs, ks
    // S ← exp(g) S; the memory Sᵀk of this column.
    float mem = 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      s[r] *= decay;
      mem += s[r] * ks[warp * kRowsPerThread + r];
    }
    partial[warp][lane] = mem;
    __syncthreads();
    mem = 0.f;
#pragma unroll
    for (int w = 0; w < kRecurrentWarps; ++w) mem += partial[w][lane];
    const float delta = (v - mem) * beta;
    __syncthreads();  // partial is read
    // S ← S + k δᵀ; o = Sᵀq.
    float o = 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      s[r] += ks[warp * kRowsPerThread + r] * delta;
      o += s[r] * qs[warp * kRowsPerThread + r];
    }
    partial[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && live) {
      o = 0.f;
#pragma unroll
      for (int w = 0; w < kRecurrentWarps; ++w) o += partial[w][lane];
      static_cast<T*>(a.out)[gate * dv + col] = from_float<T>(o);
    }
    __syncthreads();  // partial, qs and ks are free for the next token
  }
  if (a.final_state != nullptr && live) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = warp * kRowsPerThread + r;
      if (i < dk) a.final_state[state0 + static_cast<int64_t>(i) * dv + col] = s[r];
    }
  }
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("chunked_gated_delta_rule: ") + what + ": " + cudaGetErrorString(status));
}

template <class T>
void launch(const DeltaRuleArgs& a, cudaStream_t stream) {
  if (a.chunk_count == 0) return;
  const PrepareLayout prepare = prepare_layout(a.dk, a.dv);
  const RecurrenceLayout recurrence = recurrence_layout(a.dk, a.dv);
  check(cudaFuncSetAttribute(delta_prepare<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(prepare.bytes)),
        "shared memory of the prepare kernel");
  check(cudaFuncSetAttribute(delta_recurrence<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(recurrence.bytes)),
        "shared memory of the recurrence kernel");
  delta_prepare<T><<<dim3(static_cast<unsigned>(a.chunk_count), static_cast<unsigned>(a.value_heads)), kThreads,
                     prepare.bytes, stream>>>(a);
  check(cudaGetLastError(), "prepare kernel launch");
  delta_recurrence<T><<<dim3(static_cast<unsigned>((a.dv + kStateColumns - 1) / kStateColumns),
                             static_cast<unsigned>(a.sequence_count), static_cast<unsigned>(a.value_heads)),
                        kThreads, recurrence.bytes, stream>>>(a);
  check(cudaGetLastError(), "recurrence kernel launch");
}

template <class T>
void launch_recurrent(const DeltaRuleArgs& a, cudaStream_t stream) {
  if (a.seq_len == 0 || a.rows == 0) return;
  delta_recurrent<T><<<dim3(static_cast<unsigned>((a.dv + kRecurrentColumns - 1) / kRecurrentColumns),
                            static_cast<unsigned>(a.rows), static_cast<unsigned>(a.value_heads)),
                       kRecurrentWarps * 32, 0, stream>>>(a);
  check(cudaGetLastError(), "recurrent kernel launch");
}

// The head shapes both forms take; `what` names the caller in the message.
void check_heads(const DeltaRuleArgs& a, const char* what) {
  if (a.dk < 1 || a.dk > kDeltaMaxHeadDim || a.dv < 1 || a.dv > kDeltaMaxHeadDim)
    throw std::invalid_argument(std::string(what) + ": head dims " + std::to_string(a.dk) + " × " +
                                std::to_string(a.dv) + " outside 1.." + std::to_string(kDeltaMaxHeadDim));
  if (a.key_heads < 1 || a.value_heads % a.key_heads != 0)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(a.value_heads) +
                                " value heads do not share " + std::to_string(a.key_heads) + " key heads evenly");
}

}  // namespace

int64_t delta_rule_workspace_bytes(int64_t chunk_count, int64_t key_heads, int64_t value_heads, int64_t dk,
                                   int64_t dv) {
  return workspace_layout(chunk_count, value_heads, key_heads, pad16(dk), pad16(dv)).bytes;
}

void chunked_gated_delta_rule(Element element, const DeltaRuleArgs& a, cudaStream_t stream) {
  check_heads(a, "chunked_gated_delta_rule");
  if (element == Element::kBFloat16) launch<__nv_bfloat16>(a, stream);
  else launch<__half>(a, stream);
}

void recurrent_gated_delta_rule(Element element, const DeltaRuleArgs& a, cudaStream_t stream) {
  check_heads(a, "recurrent_gated_delta_rule");
  if (element == Element::kBFloat16) launch_recurrent<__nv_bfloat16>(a, stream);
  else launch_recurrent<__half>(a, stream);
}

}  // namespace dflash::cuda_kernels
