#include "gated_delta_rule.h"
#include "device_math.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kChunk = static_cast<int>(kDeltaChunk);
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 16;       // the tensor cores' tile (m16n16k16)
constexpr int kColumns = 64;    // value columns a recurrence block carries
constexpr int kFloatLd = 64 + 4;  // fp32 [64, 64] matrices, padded against bank conflicts
constexpr int kHalfLd = 64 + 8;   // 16-bit [·, 64] matrices

__host__ __device__ constexpr int pad16(int64_t d) { return static_cast<int>((d + 15) / 16 * 16); }

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, T, wmma::row_major>;
template <class T>
using FragAt = wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, T, wmma::col_major>;  // a transposed operand
template <class T>
using FragB = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, T, wmma::row_major>;
template <class T>
using FragBt = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, T, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

// acc += Σ_{kk < tiles} A_kk B_kk over 16 × 16 tiles: A_kk at a + kk·a_step
// (row stride lda), B_kk at b + kk·b_step (row stride ldb), loaded as the
// fragment types say (row- or column-major).
template <class FragAType, class FragBType, class T>
__device__ __forceinline__ void mma_tiles(Acc& acc, const T* a, int lda, int a_step, const T* b, int ldb, int b_step,
                                          int tiles) {
  for (int kk = 0; kk < tiles; ++kk) {
    FragAType fa;
    FragBType fb;
    wmma::load_matrix_sync(fa, a + kk * a_step, lda);
    wmma::load_matrix_sync(fb, b + kk * b_step, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// The workspace of one (chunk, value head): w [64, dkp], u [64, dvp], P [64, 64].
__host__ __device__ inline int64_t workspace_elements(int dkp, int dvp) {
  return static_cast<int64_t>(kChunk) * (dkp + dvp + kChunk);
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
  if (bt != nullptr) {
    bt[lane] = lane < length ? beta[lane * stride] : 0.f;
    bt[lane + 32] = lane + 32 < length ? beta[(lane + 32) * stride] : 0.f;
  }
}

// Rows i < length of src (token stride `stride`, d ≤ 128 values each),
// L2-normalised and scaled (`normalise`; else as they are), times
// factor[i] (null: 1), rounded to T into dst [64, ld]: columns d..dpad and
// rows past the length are zeros. A second destination (dst2, factor2) may
// take the same rows under another factor.
template <class T>
__device__ void load_rows(const T* src, int64_t stride, int length, int d, int dpad, bool normalise, float scale,
                          T* dst, int ld, const float* factor, T* dst2 = nullptr, const float* factor2 = nullptr) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < kChunk; i += kWarps) {
    float x[4];
    float squares = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = lane + 32 * j;
      x[j] = i < length && c < d ? to_float(src[i * stride + c]) : 0.f;
      squares += x[j] * x[j];
    }
    const float r = normalise ? rsqrtf(warp_sum(squares) + 1e-6f) * scale : scale;
    const float f = factor != nullptr ? factor[i] : 1.f;
    const float f2 = factor2 != nullptr ? factor2[i] : 1.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = lane + 32 * j;
      if (c < dpad) {
        dst[i * ld + c] = from_float<T>(x[j] * r * f);
        if (dst2 != nullptr) dst2[i * ld + c] = from_float<T>(x[j] * r * f2);
      }
    }
  }
}

// Copies a [64, width] 16-bit matrix (row stride src_ld) into shared memory
// (row stride dst_ld), columns [col0, col0 + cols) of src; zeros past
// src_cols. 16-byte moves where the columns allow.
template <class T>
__device__ void copy_rows(const T* src, int src_ld, int col0, int src_cols, T* dst, int dst_ld, int cols) {
  const int vectors = cols / 8;
  for (int e = threadIdx.x; e < kChunk * vectors; e += kThreads) {
    const int i = e / vectors, c = (e % vectors) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (col0 + c + 8 <= src_cols) value = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(i) * src_ld + col0 + c);
    *reinterpret_cast<uint4*>(dst + i * dst_ld + c) = value;
  }
}

struct PrepareLayout {
  int dkp, dvp, ld;  // ld: the 16-bit [64, ·] matrices' row stride
  int64_t kn, qn, kb, vb, a, x, tb, gc, bt, bytes;  // byte offsets
};
__host__ __device__ inline PrepareLayout prepare_layout(int64_t dk, int64_t dv) {
  PrepareLayout l{};
  l.dkp = pad16(dk);
  l.dvp = pad16(dv);
  l.ld = (l.dkp > l.dvp ? l.dkp : l.dvp) + 8;
  const int64_t half_matrix = int64_t{kChunk} * l.ld * 2, float_matrix = int64_t{kChunk} * kFloatLd * 4;
  l.kn = 0;
  l.qn = l.kn + half_matrix;  // q, then (after q kᵀ) β v
  l.vb = l.qn;
  l.kb = l.qn + half_matrix;
  l.a = l.kb + half_matrix;   // A, then the per-warp staging of w and u
  l.x = l.a + float_matrix;   // q kᵀ, then T in fp32
  l.tb = l.x + float_matrix;
  l.gc = l.tb + int64_t{kChunk} * kHalfLd * 2;
  l.bt = l.gc + kChunk * 4;
  l.bytes = l.bt + kChunk * 4;
  return l;
}

template <class T>
__global__ void __launch_bounds__(kThreads) delta_prepare(DeltaRuleArgs a) {
  const DeltaChunk ch = a.chunks[blockIdx.x];
  const int head = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int64_t key_head = head / (a.value_heads / a.key_heads);
  const PrepareLayout l = prepare_layout(dk, dv);
  extern __shared__ __align__(128) unsigned char smem[];
  T* kn = reinterpret_cast<T*>(smem + l.kn);
  T* qn = reinterpret_cast<T*>(smem + l.qn);
  T* vb = reinterpret_cast<T*>(smem + l.vb);
  T* kb = reinterpret_cast<T*>(smem + l.kb);
  float* A = reinterpret_cast<float*>(smem + l.a);
  float* X = reinterpret_cast<float*>(smem + l.x);
  T* Tb = reinterpret_cast<T*>(smem + l.tb);
  float* gc = reinterpret_cast<float*>(smem + l.gc);
  float* bt = reinterpret_cast<float*>(smem + l.bt);

  const int64_t token0 = static_cast<int64_t>(ch.row) * a.seq_len + ch.start;
  const int64_t gate = token0 * a.value_heads + head;
  if (warp == 0) chunk_decay(a.g + gate, a.beta + gate, a.value_heads, ch.length, gc, bt);
  __syncthreads();
  __shared__ float kb_factor[kChunk];
  if (threadIdx.x < kChunk) kb_factor[threadIdx.x] = bt[threadIdx.x] * expf(gc[threadIdx.x]);
  __syncthreads();
  const T* q = static_cast<const T*>(a.q) + ch.row * a.q_stride[0] + ch.start * a.q_stride[1] + key_head * a.q_stride[2];
  const T* k = static_cast<const T*>(a.k) + ch.row * a.k_stride[0] + ch.start * a.k_stride[1] + key_head * a.k_stride[2];
  const T* v = static_cast<const T*>(a.v) + ch.row * a.v_stride[0] + ch.start * a.v_stride[1] + head * a.v_stride[2];
  load_rows(k, a.k_stride[1], ch.length, dk, l.dkp, true, 1.f, kn, l.ld, nullptr, kb, kb_factor);
  load_rows(q, a.q_stride[1], ch.length, dk, l.dkp, true, rsqrtf(static_cast<float>(dk)), qn, l.ld, nullptr);
  __syncthreads();

  // A = k kᵀ and q kᵀ, lower tiles only (the upper ones are masked to zero).
  const int k_tiles = l.dkp / kTile;
  for (int job = warp; job < 20; job += kWarps) {
    const bool is_q = job >= 10;
    int t = job % 10, ti = 0;
    while (t > ti) t -= ++ti;  // (ti, tj = t) over the 10 lower tiles of 4 × 4
    const int tj = t;
    Acc acc;
    wmma::fill_fragment(acc, 0.f);
    mma_tiles<FragA<T>, FragBt<T>>(acc, (is_q ? qn : kn) + ti * kTile * l.ld, l.ld, kTile, kn + tj * kTile * l.ld, l.ld,
                                   kTile, k_tiles);
    wmma::store_matrix_sync((is_q ? X : A) + ti * kTile * kFloatLd + tj * kTile, acc, kFloatLd, wmma::mem_row_major);
  }
  __syncthreads();

  // The decays; P to the workspace; β v into q's buffer (q is read).
  const int dkp = l.dkp, dvp = l.dvp;
  T* work = static_cast<T*>(a.workspace) + (static_cast<int64_t>(blockIdx.x) * a.value_heads + head) *
                                               workspace_elements(dkp, dvp);
  T* w_out = work;
  T* u_out = w_out + kChunk * dkp;
  T* p_out = u_out + kChunk * dvp;
  for (int e = threadIdx.x; e < kChunk * kChunk; e += kThreads) {
    const int i = e / kChunk, j = e % kChunk;
    const float decay = i >= j ? expf(gc[i] - gc[j]) : 0.f;
    A[i * kFloatLd + j] = i > j ? bt[i] * A[i * kFloatLd + j] * decay : 0.f;
    p_out[e] = from_float<T>(i >= j ? X[i * kFloatLd + j] * decay : 0.f);
  }
  load_rows(v, a.v_stride[1], ch.length, dv, dvp, false, 1.f, vb, l.ld, bt);
  __syncthreads();

  // T = (I + A)⁻¹, unit lower triangular: column c by forward substitution,
  // x_i = −Σ_{c ≤ m < i} A[i, m] x_m, four lanes splitting each sum.
  {
    const int c = threadIdx.x / 4, part = threadIdx.x % 4;
    for (int i = 0; i < kChunk; ++i) {
      float s = 0.f;
      for (int m = c + part; m < i; m += 4) s += A[i * kFloatLd + m] * X[m * kFloatLd + c];
      s += __shfl_xor_sync(0xffffffff, s, 1);
      s += __shfl_xor_sync(0xffffffff, s, 2);
      if (part == 0) X[i * kFloatLd + c] = i == c ? 1.f : (i < c ? 0.f : -s);
      __syncwarp();
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kChunk * kChunk; e += kThreads)
    Tb[(e / kChunk) * kHalfLd + e % kChunk] = from_float<T>(X[(e / kChunk) * kFloatLd + e % kChunk]);
  __syncthreads();

  // w = T (β k ⊙ exp(decay)), u = T (β v); T is lower triangular, so row
  // tile ti reads only k tiles ≤ ti. Each warp stages its tile in A's space.
  float* staging = A + warp * kTile * kTile;
  const int w_tiles = dkp / kTile, u_tiles = dvp / kTile;
  for (int job = warp; job < 4 * (w_tiles + u_tiles); job += kWarps) {
    const int ti = job % 4, tj = job / 4;
    const bool is_w = tj < w_tiles;
    const int col = (is_w ? tj : tj - w_tiles) * kTile;
    Acc acc;
    wmma::fill_fragment(acc, 0.f);
    mma_tiles<FragA<T>, FragB<T>>(acc, Tb + ti * kTile * kHalfLd, kHalfLd, kTile, (is_w ? kb : vb) + col, l.ld,
                                  kTile * l.ld, ti + 1);
    wmma::store_matrix_sync(staging, acc, kTile, wmma::mem_row_major);
    __syncwarp();
    T* dst = (is_w ? w_out : u_out) + ti * kTile * (is_w ? dkp : dvp) + col;
    for (int e = lane; e < kTile * kTile; e += 32)
      dst[(e / kTile) * (is_w ? dkp : dvp) + e % kTile] = from_float<T>(staging[e]);
    __syncwarp();
  }
}

struct RecurrenceLayout {
  int dkp, dvp, ld;
  int64_t h, hb, w, qd, kd, u, p, vn, s, gc, bytes;
};
__host__ __device__ inline RecurrenceLayout recurrence_layout(int64_t dk, int64_t dv) {
  RecurrenceLayout l{};
  l.dkp = pad16(dk);
  l.dvp = pad16(dv);
  l.ld = l.dkp + 8;
  const int64_t key_matrix = int64_t{kChunk} * l.ld * 2, column_matrix = int64_t{kChunk} * kHalfLd * 2;
  l.h = 0;                                              // fp32 [dkp, 64]
  l.hb = l.h + int64_t{l.dkp} * kFloatLd * 4;           // T [dkp, 64]
  l.w = l.hb + int64_t{l.dkp} * kHalfLd * 2;
  l.qd = l.w + key_matrix;
  l.kd = l.qd + key_matrix;
  l.u = l.kd + key_matrix;
  l.p = l.u + column_matrix;
  l.vn = l.p + column_matrix;
  l.s = l.vn + column_matrix;                           // fp32 [64, 64]
  l.gc = l.s + int64_t{kChunk} * kFloatLd * 4;
  l.bytes = l.gc + 2 * kChunk * 4;
  return l;
}

template <class T>
__global__ void __launch_bounds__(kThreads) delta_recurrence(DeltaRuleArgs a) {
  const DeltaSequence sq = a.sequences[blockIdx.x];
  const int head = blockIdx.y, warp = threadIdx.x / 32;
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int col0 = blockIdx.z * kColumns, cols = min(kColumns, dv - col0);
  const int64_t key_head = head / (a.value_heads / a.key_heads);
  const RecurrenceLayout l = recurrence_layout(dk, dv);
  const int dkp = l.dkp, dvp = l.dvp;
  extern __shared__ __align__(128) unsigned char smem[];
  float* H = reinterpret_cast<float*>(smem + l.h);
  T* Hb = reinterpret_cast<T*>(smem + l.hb);
  T* W = reinterpret_cast<T*>(smem + l.w);
  T* Qd = reinterpret_cast<T*>(smem + l.qd);
  T* Kd = reinterpret_cast<T*>(smem + l.kd);
  T* U = reinterpret_cast<T*>(smem + l.u);
  T* P = reinterpret_cast<T*>(smem + l.p);
  T* Vn = reinterpret_cast<T*>(smem + l.vn);
  float* S = reinterpret_cast<float*>(smem + l.s);
  float* gc = reinterpret_cast<float*>(smem + l.gc);
  float* kd_factor = gc + kChunk;
  __shared__ float q_factor[kChunk];

  const int64_t state0 = (static_cast<int64_t>(sq.row) * a.value_heads + head) * dk * dv;
  const bool from_initial = (sq.flags & kSequenceFromInitial) != 0 && a.initial != nullptr;
  for (int e = threadIdx.x; e < dkp * kColumns; e += kThreads) {
    const int r = e / kColumns, c = e % kColumns;
    const float value = from_initial && r < dk && c < cols ? a.initial[state0 + static_cast<int64_t>(r) * dv + col0 + c] : 0.f;
    H[r * kFloatLd + c] = value;
    Hb[r * kHalfLd + c] = from_float<T>(value);
  }
  const int k_tiles = dkp / kTile;
  for (int n = 0; n < sq.chunk_count; ++n) {
    const int chunk_index = sq.first_chunk + n;
    const DeltaChunk ch = a.chunks[chunk_index];
    const int64_t token0 = static_cast<int64_t>(ch.row) * a.seq_len + ch.start;
    if (warp == 0) chunk_decay(a.g + token0 * a.value_heads + head, nullptr, a.value_heads, ch.length, gc, nullptr);
    __syncthreads();  // gc; and the previous chunk's Hb
    const float last = gc[kChunk - 1];  // padding tokens add no decay
    if (threadIdx.x < kChunk) {
      q_factor[threadIdx.x] = expf(gc[threadIdx.x]);
      kd_factor[threadIdx.x] = expf(last - gc[threadIdx.x]);
    }
    __syncthreads();
    const T* q = static_cast<const T*>(a.q) + ch.row * a.q_stride[0] + ch.start * a.q_stride[1] + key_head * a.q_stride[2];
    const T* k = static_cast<const T*>(a.k) + ch.row * a.k_stride[0] + ch.start * a.k_stride[1] + key_head * a.k_stride[2];
    load_rows(q, a.q_stride[1], ch.length, dk, dkp, true, rsqrtf(static_cast<float>(dk)), Qd, l.ld, q_factor);
    load_rows(k, a.k_stride[1], ch.length, dk, dkp, true, 1.f, Kd, l.ld, kd_factor);
    const T* work = static_cast<const T*>(a.workspace) + (static_cast<int64_t>(chunk_index) * a.value_heads + head) *
                                                             workspace_elements(dkp, dvp);
    copy_rows(work, dkp, 0, dkp, W, l.ld, dkp);
    copy_rows(work + kChunk * dkp, dvp, col0, dvp, U, kHalfLd, kColumns);
    copy_rows(work + kChunk * (dkp + dvp), kChunk, 0, kChunk, P, kHalfLd, kChunk);
    __syncthreads();

    // S = w H  [64, 64]
    for (int job = warp; job < 16; job += kWarps) {
      const int ti = job / 4, tj = job % 4;
      Acc acc;
      wmma::fill_fragment(acc, 0.f);
      mma_tiles<FragA<T>, FragB<T>>(acc, W + ti * kTile * l.ld, l.ld, kTile, Hb + tj * kTile, kHalfLd, kTile * kHalfLd,
                                    k_tiles);
      wmma::store_matrix_sync(S + ti * kTile * kFloatLd + tj * kTile, acc, kFloatLd, wmma::mem_row_major);
    }
    __syncthreads();
    // v' = u − w H
    for (int e = threadIdx.x; e < kChunk * kColumns; e += kThreads) {
      const int i = e / kColumns, c = e % kColumns;
      Vn[i * kHalfLd + c] = from_float<T>(to_float(U[i * kHalfLd + c]) - S[i * kFloatLd + c]);
    }
    __syncthreads();
    // o = (q ⊙ exp(decay)) H + P v'
    for (int job = warp; job < 16; job += kWarps) {
      const int ti = job / 4, tj = job % 4;
      Acc acc;
      wmma::fill_fragment(acc, 0.f);
      mma_tiles<FragA<T>, FragB<T>>(acc, Qd + ti * kTile * l.ld, l.ld, kTile, Hb + tj * kTile, kHalfLd, kTile * kHalfLd,
                                    k_tiles);
      mma_tiles<FragA<T>, FragB<T>>(acc, P + ti * kTile * kHalfLd, kHalfLd, kTile, Vn + tj * kTile, kHalfLd,
                                    kTile * kHalfLd, ti + 1);
      wmma::store_matrix_sync(S + ti * kTile * kFloatLd + tj * kTile, acc, kFloatLd, wmma::mem_row_major);
    }
    // H ← exp(decay_last) H + (k ⊙ exp(decay_last − decay))ᵀ v'  (H is not
    // read by the o products above: they read Hb)
    const float carry = expf(last);
    for (int job = warp; job < k_tiles * 4; job += kWarps) {
      const int ti = job / 4, tj = job % 4;
      Acc acc;
      wmma::load_matrix_sync(acc, H + ti * kTile * kFloatLd + tj * kTile, kFloatLd, wmma::mem_row_major);
      for (int e = 0; e < acc.num_elements; ++e) acc.x[e] *= carry;
      mma_tiles<FragAt<T>, FragB<T>>(acc, Kd + ti * kTile, l.ld, kTile * l.ld, Vn + tj * kTile, kHalfLd, kTile * kHalfLd,
                                     kChunk / kTile);
      wmma::store_matrix_sync(H + ti * kTile * kFloatLd + tj * kTile, acc, kFloatLd, wmma::mem_row_major);
    }
    __syncthreads();
    T* out = static_cast<T*>(a.out) + (token0 * a.value_heads + head) * dv + col0;
    for (int e = threadIdx.x; e < kChunk * kColumns; e += kThreads) {
      const int i = e / kColumns, c = e % kColumns;
      if (i < ch.length && c < cols) out[static_cast<int64_t>(i) * a.value_heads * dv + c] = from_float<T>(S[i * kFloatLd + c]);
    }
    for (int e = threadIdx.x; e < dkp * kColumns; e += kThreads) {
      const int r = e / kColumns, c = e % kColumns;
      Hb[r * kHalfLd + c] = from_float<T>(H[r * kFloatLd + c]);
    }
  }
  if ((sq.flags & kSequenceWritesFinal) != 0 && a.final_state != nullptr) {
    __syncthreads();
    for (int e = threadIdx.x; e < dk * kColumns; e += kThreads) {
      const int r = e / kColumns, c = e % kColumns;
      if (c < cols) a.final_state[state0 + static_cast<int64_t>(r) * dv + col0 + c] = H[r * kFloatLd + c];
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
  delta_recurrence<T><<<dim3(static_cast<unsigned>(a.sequence_count), static_cast<unsigned>(a.value_heads),
                             static_cast<unsigned>((a.dv + kColumns - 1) / kColumns)),
                        kThreads, recurrence.bytes, stream>>>(a);
  check(cudaGetLastError(), "recurrence kernel launch");
}

}  // namespace

int64_t delta_rule_workspace_bytes(int64_t chunk_count, int64_t value_heads, int64_t dk, int64_t dv) {
  return chunk_count * value_heads * workspace_elements(pad16(dk), pad16(dv)) * 2;
}

void chunked_gated_delta_rule(Element element, const DeltaRuleArgs& a, cudaStream_t stream) {
  if (a.dk < 1 || a.dk > kDeltaMaxHeadDim || a.dv < 1 || a.dv > kDeltaMaxHeadDim)
    throw std::invalid_argument("chunked_gated_delta_rule: head dims " + std::to_string(a.dk) + " × " +
                                std::to_string(a.dv) + " outside 1.." + std::to_string(kDeltaMaxHeadDim));
  if (a.key_heads < 1 || a.value_heads % a.key_heads != 0)
    throw std::invalid_argument("chunked_gated_delta_rule: " + std::to_string(a.value_heads) +
                                " value heads do not share " + std::to_string(a.key_heads) + " key heads evenly");
  if (element == Element::kBFloat16) launch<__nv_bfloat16>(a, stream);
  else launch<__half>(a, stream);
}

}  // namespace dflash::cuda_kernels
