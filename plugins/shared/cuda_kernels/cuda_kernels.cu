#include "cuda_kernels.h"
#include "device_math.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace dflash::cuda_kernels {
namespace {

constexpr int kRowThreads = 256;

// One block per row; the row is read twice (the second time from L1/L2).
template <class T, int kVec>
__global__ void rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out,
                                float* __restrict__ rstd, int64_t width, float eps) {
  using P = Pack<T, kVec>;
  const P* row = reinterpret_cast<const P*>(x + static_cast<int64_t>(blockIdx.x) * width);
  P* dst = reinterpret_cast<P*>(out + static_cast<int64_t>(blockIdx.x) * width);
  const P* w = reinterpret_cast<const P*>(weight);
  const int64_t packs = width / kVec;
  float squares = 0.f;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const P v = row[p];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float f = to_float(v.v[i]);
      squares += f * f;
    }
  }
  const float scale = rsqrtf(block_sum(squares) / static_cast<float>(width) + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = scale;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const P v = row[p];
    const P g = w[p];
    P y;
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      y.v[i] = from_float<T>(to_float(g.v[i]) * rounded<T>(to_float(v.v[i]) * scale));
    dst[p] = y;
  }
}

constexpr int kWarpsPerBlock = 8;

// One warp per head vector of one token: q heads, then k heads, then v heads.
// Token t rotates by table row positions[t] and writes its k and v at row
// slots[t] (null: row t for either).
template <class T>
__global__ void qk_norm_rope_kernel(const T* __restrict__ qkv, const T* __restrict__ q_norm,
                                    const T* __restrict__ k_norm, const float* __restrict__ cos_table,
                                    const float* __restrict__ sin_table, const int64_t* __restrict__ positions,
                                    const int64_t* __restrict__ slots, T* __restrict__ q, T* __restrict__ k,
                                    T* __restrict__ v, float* __restrict__ rstd, int64_t tokens, int heads,
                                    int kv_heads, int head_dim, float eps) {
  extern __shared__ float staged[];  // [kWarpsPerBlock][head_dim]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_token = heads + 2 * kv_heads;
  const int64_t vector = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (vector >= tokens * per_token) return;
  const int64_t token = vector / per_token;
  const int slot = static_cast<int>(vector % per_token);
  const T* src = qkv + vector * head_dim;
  const int64_t kv_row = slots != nullptr ? slots[token] : token;
  if (slot >= heads + kv_heads) {  // v: a copy into its own row
    T* dst = v + (kv_row * kv_heads + (slot - heads - kv_heads)) * head_dim;
    for (int j = lane; j < head_dim; j += 32) dst[j] = src[j];
    return;
  }
  const bool is_q = slot < heads;
  T* dst = is_q ? q + (token * heads + slot) * head_dim : k + (kv_row * kv_heads + (slot - heads)) * head_dim;
  const T* norm = is_q ? q_norm : k_norm;
  float* y = staged + warp * head_dim;
  if (norm != nullptr) {
    float squares = 0.f;
    for (int j = lane; j < head_dim; j += 32) {
      const float f = to_float(src[j]);
      squares += f * f;
    }
    const float scale = rsqrtf(warp_sum(squares) / static_cast<float>(head_dim) + eps);
    if (rstd != nullptr && lane == 0) rstd[vector] = scale;
    for (int j = lane; j < head_dim; j += 32)
      y[j] = rounded<T>(to_float(norm[j]) * rounded<T>(to_float(src[j]) * scale));
  } else {
    for (int j = lane; j < head_dim; j += 32) y[j] = to_float(src[j]);
  }
  __syncwarp();
  // x·cos + rotate_half(x)·sin, rotate_half(x) = (−x₂, x₁), each product and
  // the sum rounded as transformers' bf16 arithmetic rounds them.
  const int half = head_dim / 2;
  const int64_t position = positions != nullptr ? positions[token] : token;
  const float* c = cos_table + position * half;
  const float* s = sin_table + position * half;
  for (int j = lane; j < head_dim; j += 32) {
    const int i = j < half ? j : j - half;
    const float rotated = j < half ? -y[j + half] : y[j - half];
    const float a = rounded<T>(y[j] * rounded<T>(c[i]));
    const float b = rounded<T>(rotated * rounded<T>(s[i]));
    dst[j] = from_float<T>(a + b);
  }
}

template <class T, int kVec>
__global__ void swiglu_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows, int64_t width) {
  using P = Pack<T, kVec>;
  const int64_t packs_per_row = width / kVec;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * packs_per_row) return;
  const int64_t row = index / packs_per_row, col = index % packs_per_row;
  const P g = reinterpret_cast<const P*>(gate_up + row * 2 * width)[col];
  const P u = reinterpret_cast<const P*>(gate_up + row * 2 * width + width)[col];
  P y;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const float x = to_float(g.v[i]);
    y.v[i] = from_float<T>(rounded<T>(x / (1.f + __expf(-x))) * to_float(u.v[i]));
  }
  reinterpret_cast<P*>(out + row * width)[col] = y;
}


// ---- Backward kernels (training) -------------------------------------------

// rms_norm's dx: one warp per row (rows of a few thousand elements read twice,
// the second time from L1/L2).
template <class T, int kVec>
__global__ void rms_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
                                         const float* __restrict__ rstd, T* __restrict__ dx, int64_t rows, int64_t width) {
  using P = Pack<T, kVec>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= rows) return;
  const P* xr = reinterpret_cast<const P*>(x + row * width);
  const P* gr = reinterpret_cast<const P*>(dy + row * width);
  const P* w = reinterpret_cast<const P*>(weight);
  P* out = reinterpret_cast<P*>(dx + row * width);
  const float r = rstd[row];
  const int64_t packs = width / kVec;
  float dot = 0.f;
  for (int64_t p = lane; p < packs; p += 32) {
    const P xv = xr[p], gv = gr[p], wv = w[p];
#pragma unroll
    for (int i = 0; i < kVec; ++i) dot += to_float(gv.v[i]) * to_float(wv.v[i]) * (to_float(xv.v[i]) * r);
  }
  const float mean = warp_sum(dot) / static_cast<float>(width);
  for (int64_t p = lane; p < packs; p += 32) {
    const P xv = xr[p], gv = gr[p], wv = w[p];
    P y;
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      y.v[i] = from_float<T>(r * (to_float(gv.v[i]) * to_float(wv.v[i]) - to_float(xv.v[i]) * r * mean));
    out[p] = y;
  }
}

// The norm weight's gradient, Σ_rows dy ⊙ round(x·rstd), in fp32 partial sums:
// block (x, y) sums columns [blockDim.x·x, +blockDim.x) over chunk y's rows
// into partial[y, column] (coalesced: a warp reads consecutive columns of a row).
template <class T>
__global__ void rms_norm_weight_grad_kernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ rstd,
                                            float* __restrict__ partial, int64_t rows, int64_t width,
                                            int64_t rows_per_chunk) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= width) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0.f;
  for (int64_t r = begin; r < end; ++r)
    sum += to_float(dy[r * width + column]) * rounded<T>(to_float(x[r * width + column]) * rstd[r]);
  partial[static_cast<int64_t>(blockIdx.y) * width + column] = sum;
}

// head_norm_rope's backward, one warp per head vector: undo the rotation
// (dn = dout·cos + rotate_halfᵀ(dout·sin), rounded to T as autograd's bf16
// chain rounds it), then the norm's dx from dn ⊙ weight. dn is written out
// for the weight's gradient.
template <class T>
__global__ void head_norm_rope_backward_kernel(const T* __restrict__ dout, const T* __restrict__ x,
                                               const T* __restrict__ weight, const float* __restrict__ rstd,
                                               const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                                               T* __restrict__ dx, T* __restrict__ dn_out, int64_t vectors, int heads,
                                               int head_dim) {
  extern __shared__ float staged[];  // [kWarpsPerBlock][head_dim]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t vector = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (vector >= vectors) return;
  const int64_t token = vector / heads;
  const int half = head_dim / 2;
  const T* g = dout + vector * head_dim;
  const T* xv = x + vector * head_dim;
  const float* c = cos_table + token * half;
  const float* s = sin_table + token * half;
  float* dn = staged + warp * head_dim;
  for (int j = lane; j < head_dim; j += 32) {
    const int i = j < half ? j : j - half;
    float v = to_float(g[j]) * rounded<T>(c[i]);
    if (j < half) v += to_float(g[j + half]) * rounded<T>(s[i]);
    else v -= to_float(g[j - half]) * rounded<T>(s[i]);
    dn[j] = rounded<T>(v);
  }
  __syncwarp();
  const float r = rstd[vector];
  float dot = 0.f;
  for (int j = lane; j < head_dim; j += 32) dot += dn[j] * to_float(weight[j]) * (to_float(xv[j]) * r);
  const float mean = warp_sum(dot) / static_cast<float>(head_dim);
  for (int j = lane; j < head_dim; j += 32) {
    const float xf = to_float(xv[j]);
    dx[vector * head_dim + j] = from_float<T>(r * (dn[j] * to_float(weight[j]) - xf * r * mean));
    dn_out[vector * head_dim + j] = from_float<T>(dn[j]);
  }
}

template <class T, int kVec>
__global__ void swiglu_backward_kernel(const T* __restrict__ gate_up, const T* __restrict__ d_out, T* __restrict__ d_gate_up,
                                       int64_t rows, int64_t width) {
  using P = Pack<T, kVec>;
  const int64_t packs_per_row = width / kVec;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * packs_per_row) return;
  const int64_t row = index / packs_per_row, col = index % packs_per_row;
  const P g = reinterpret_cast<const P*>(gate_up + row * 2 * width)[col];
  const P u = reinterpret_cast<const P*>(gate_up + row * 2 * width + width)[col];
  const P d = reinterpret_cast<const P*>(d_out + row * width)[col];
  P dg, du;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const float x = to_float(g.v[i]), up = to_float(u.v[i]), grad = to_float(d.v[i]);
    const float sigmoid = 1.f / (1.f + __expf(-x));
    du.v[i] = from_float<T>(grad * rounded<T>(x * sigmoid));
    dg.v[i] = from_float<T>(grad * up * sigmoid * (1.f + x * (1.f - sigmoid)));
  }
  reinterpret_cast<P*>(d_gate_up + row * 2 * width)[col] = dg;
  reinterpret_cast<P*>(d_gate_up + row * 2 * width + width)[col] = du;
}


// ---- Row-invariant decoding attention (exact decoding) ---------------------
// Nothing in it depends on how many queries a call has beyond which ones it
// computes: every output element is summed by the same instructions in the
// same order (explicit FMAs and rounded adds: no contraction left to the
// compiler). The row-invariant linear is in invariant_linear.cu.

constexpr int kAttentionThreads = 256;
// A thread's loads issued together before their products: a block's time
// is its threads' waits on their loads (below), so 4 in flight at once, not
// one after another; each product still in its own order. (4, not yet
// timed: nvcc gives a thread 76 registers at one query a block and 128 at
// eight, without spills.)
constexpr int kAttentionLoads = 4;
// The most query heads, and queries (heads × tokens), one block attends:
// the kernels compiled below (AttentionTiling's defaults).
constexpr int kMaxBlockHeads = AttentionTiling{}.max_heads;
constexpr int kMaxBlockQueries = AttentionTiling{}.max_queries;

// block_reduce (device_math.cuh) of Q values at once: each value by the same
// butterfly and the same warp order as block_reduce alone, so each result
// is bitwise block_reduce's of that value; two barriers for all Q, not 2·Q.
template <int Q, class Op>
__device__ void block_reduce_each(float (&x)[Q], float identity, Op op) {
  __shared__ float partial[32 * Q];
  __shared__ float total[Q];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    x[i] = warp_reduce(x[i], op);
    if (lane == 0) partial[warp * Q + i] = x[i];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < Q; ++i) {
      float y = lane < (blockDim.x + 31) / 32 ? partial[lane * Q + i] : identity;
      y = warp_reduce(y, op);
      if (lane == 0) total[i] = y;
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < Q; ++i) x[i] = total[i];
}

// One block per G query heads that share a KV head and TK consecutive
// queries of one session's step (a chain's block, a draft tree's nodes): a
// key or value row all its queries see (the session's cache before the
// step; every row of a chain) is read once for all G·TK of them; a tree
// node's own path rows, once for its G heads. One block per query token and
// head read each row once per query: on an H100 (2026-12-07, docs/eval.md)
// that kernel was bound by L2 at 33 and more queries (its time followed its
// blocks' count) and by its threads' waits on their loads, one after
// another, below. A block of several tokens that loaded each row once per
// token (relying on L1 for the rest) was slower for a 16-token chain (31 µs
// against 17): hence one load a shared row, and kAttentionLoads in flight.
// Each query's arithmetic is what it was alone, whatever G and TK: scores
// of all its keys into shared memory (one thread per key, the dot product in
// order of head_dim), the exact maximum, the probabilities and their sum
// (thread-strided, then a fixed tree: block_reduce_each), and the weighted
// values: thread (slice, chunk) sums keys slice, slice + slices, … of one
// 8-wide chunk of head_dim; the slices are then added in order. All of it
// depends on the query's key count, not on n, G or TK.
template <class T, int G, int TK>
__global__ void invariant_decode_attention_kernel(const T* __restrict__ q, const T* __restrict__ keys,
                                                  const T* __restrict__ values, const int32_t* __restrict__ cu_k,
                                                  const int32_t* __restrict__ seqused_k,
                                                  const int32_t* __restrict__ tree_rows,
                                                  const int32_t* __restrict__ tree_lengths, int tree_stride,
                                                  T* __restrict__ out, int n, int heads, int kv_heads, int head_dim,
                                                  int score_stride, float scale) {
  using P = Pack<T, 8>;
  constexpr int Q = G * TK;  // query i: the block's token i / G, head i % G
  extern __shared__ float shared[];
  const int chunks = head_dim / 8, slices = kAttentionThreads / chunks;
  float* qf = shared;                  // [Q, head_dim]
  float* scores = qf + Q * head_dim;   // [Q, score_stride]; at the end the slices' sums [Q, slices, head_dim]
  const int tiles = (n + TK - 1) / TK;
  const int session = blockIdx.x / tiles, first = blockIdx.x % tiles * TK;  // the block's first query of the step
  const int first_head = blockIdx.y * G, tid = threadIdx.x;
  const int64_t first_token = static_cast<int64_t>(session) * n + first;
  // A chain's query i sees the session's first prefix + i + 1 rows. A draft
  // tree's node sees the prefix and then its path from the root, itself
  // last (tree_rows: their rows in the session): the same keys, in the same
  // order, as the token decoded alone after that path, so the same sums.
  // Keys below `shared_end` are the same rows for all the block's queries.
  const int prefix = seqused_k[session] - n;
  int key_count[TK];
  const int32_t* path[TK];
  int most_keys = 0;
#pragma unroll
  for (int t = 0; t < TK; ++t) {
    key_count[t] = 0;  // past the step's last query: no keys, no output
    path[t] = nullptr;
    if (first + t >= n) continue;
    key_count[t] = prefix + (tree_rows != nullptr ? tree_lengths[first_token + t] : first + t + 1);
    if (tree_rows != nullptr) path[t] = tree_rows + (first_token + t) * tree_stride - prefix;
    if (key_count[t] > most_keys) most_keys = key_count[t];
  }
  const int shared_end = tree_rows != nullptr ? prefix : most_keys;
  const int64_t stride = static_cast<int64_t>(kv_heads) * head_dim;
  const int kv = first_head / (heads / kv_heads);
  const T* k0 = keys + static_cast<int64_t>(cu_k[session]) * stride + kv * head_dim;
  const T* v0 = values + static_cast<int64_t>(cu_k[session]) * stride + kv * head_dim;
  for (int i = tid; i < Q * head_dim; i += kAttentionThreads) {
    const int query = i / head_dim, t = query / G;
    if (first + t < n)
      qf[i] = to_float(q[((first_token + t) * heads + first_head + query % G) * head_dim + i % head_dim]);
  }
  __syncthreads();

  float reduced[Q];
#pragma unroll
  for (int i = 0; i < Q; ++i) reduced[i] = -INFINITY;
  // The dot products of key row `kr` with the queries of tokens [t_begin,
  // t_end) that see `key`, each in order of head_dim; then their scores.
  auto score_row = [&](const P* kr, int key, int t_begin, int t_end) {
    float dot[Q];
#pragma unroll
    for (int i = 0; i < Q; ++i) dot[i] = 0.f;
    for (int c0 = 0; c0 < chunks; c0 += kAttentionLoads) {
      P kv8[kAttentionLoads];  // the loads first, all in flight at once
#pragma unroll
      for (int b = 0; b < kAttentionLoads; ++b)
        if (c0 + b < chunks) kv8[b] = kr[c0 + b];
#pragma unroll
      for (int b = 0; b < kAttentionLoads; ++b) {
        if (c0 + b >= chunks) break;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float k = to_float(kv8[b].v[e]);
#pragma unroll
          for (int i = 0; i < Q; ++i)
            if (i / G >= t_begin && i / G < t_end && key < key_count[i / G])
              dot[i] = __fmaf_rn(qf[i * head_dim + (c0 + b) * 8 + e], k, dot[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < Q; ++i)
      if (i / G >= t_begin && i / G < t_end && key < key_count[i / G]) {
        const float s = __fmul_rn(dot[i], scale);
        scores[i * score_stride + key] = s;
        reduced[i] = fmaxf(reduced[i], s);
      }
  };
  for (int key = tid; key < shared_end; key += kAttentionThreads)
    score_row(reinterpret_cast<const P*>(k0 + key * stride), key, 0, TK);
  for (int key = shared_end + tid; key < most_keys; key += kAttentionThreads)  // a tree's paths: each node its own rows
#pragma unroll
    for (int t = 0; t < TK; ++t)
      if (key < key_count[t]) score_row(reinterpret_cast<const P*>(k0 + static_cast<int64_t>(path[t][key]) * stride), key, t, t + 1);
  block_reduce_each<Q>(reduced, -INFINITY, Max{});
  float m[Q];
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    m[i] = reduced[i];
    reduced[i] = 0.f;
  }
  for (int key = tid; key < most_keys; key += kAttentionThreads) {
#pragma unroll
    for (int i = 0; i < Q; ++i) {
      if (key >= key_count[i / G]) continue;
      const float p = __expf(__fsub_rn(scores[i * score_stride + key], m[i]));
      scores[i * score_stride + key] = p;
      reduced[i] = __fadd_rn(reduced[i], p);
    }
  }
  block_reduce_each<Q>(reduced, 0.f, Add{});  // its barriers also publish the probabilities

  // Thread (slice, chunk): keys slice, slice + slices, … in that order for
  // every query (the shared rows first: they are the lower keys).
  const int chunk = tid % chunks, slice = tid / chunks;
  float acc[Q][8];
#pragma unroll
  for (int i = 0; i < Q; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.f;
  auto weigh = [&](const P& v8, int key, int t_begin, int t_end) {
#pragma unroll
    for (int i = 0; i < Q; ++i)
      if (i / G >= t_begin && i / G < t_end && key < key_count[i / G]) {
        const float p = scores[i * score_stride + key];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][e] = __fmaf_rn(p, to_float(v8.v[e]), acc[i][e]);
      }
  };
  if (slice < slices) {
    for (int key0 = slice; key0 < shared_end; key0 += slices * kAttentionLoads) {
      P v8[kAttentionLoads];  // the loads first, all in flight at once
#pragma unroll
      for (int b = 0; b < kAttentionLoads; ++b) {
        const int key = key0 + b * slices;
        if (key < shared_end) v8[b] = reinterpret_cast<const P*>(v0 + key * stride)[chunk];
      }
#pragma unroll
      for (int b = 0; b < kAttentionLoads; ++b) {
        const int key = key0 + b * slices;
        if (key >= shared_end) break;
        weigh(v8[b], key, 0, TK);
      }
    }
    // A tree's paths: this thread's first key at or past shared_end.
    const int first_path_key = shared_end <= slice ? slice : slice + (shared_end - slice + slices - 1) / slices * slices;
    for (int key = first_path_key; key < most_keys; key += slices)
#pragma unroll
      for (int t = 0; t < TK; ++t)
        if (key < key_count[t])
          weigh(reinterpret_cast<const P*>(v0 + static_cast<int64_t>(path[t][key]) * stride)[chunk], key, t, t + 1);
  }
  __syncthreads();  // every score read: the slices' sums go where the scores were
  float* partial = scores;
  if (slice < slices)
#pragma unroll
    for (int i = 0; i < Q; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) partial[(i * slices + slice) * head_dim + chunk * 8 + e] = acc[i][e];
  __syncthreads();
  for (int i = tid; i < Q * head_dim; i += kAttentionThreads) {
    const int query = i / head_dim, t = query / G, d = i % head_dim;
    if (first + t >= n) continue;
    float sum = 0.f;
    for (int s = 0; s < slices; ++s) sum = __fadd_rn(sum, partial[(query * slices + s) * head_dim + d]);
    out[((first_token + t) * heads + first_head + query % G) * head_dim + d] = from_float<T>(__fdiv_rn(sum, reduced[query]));
  }
}

// A block's scores of a query: every key a session may hold, and room for
// the slices' sums [slices, head_dim] (2048 floats) that reuse them.
int64_t attention_score_stride(int64_t head_dim, int64_t max_keys) {
  const int64_t slices = kAttentionThreads / (head_dim / 8);
  return std::max(max_keys, slices * head_dim);
}
// A block's shared memory for its `queries`: each one's query and scores.
size_t attention_shared_bytes(int64_t head_dim, int64_t max_keys, int64_t queries) {
  return sizeof(float) * static_cast<size_t>(queries * (head_dim + attention_score_stride(head_dim, max_keys)));
}

// The most shared memory one block may opt into on the current device.
size_t shared_memory_limit() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return 48 * 1024;
  return static_cast<size_t>(bytes);
}

template <class T>
void rms_norm_typed(const void* x, const void* w, void* out, float* rstd, int64_t rows, int64_t width, float eps,
                    cudaStream_t stream) {
  if (rows == 0) return;
  const auto* xt = static_cast<const T*>(x);
  const auto* wt = static_cast<const T*>(w);
  auto* ot = static_cast<T*>(out);
  if (width % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(out))
    rms_norm_kernel<T, 8><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(xt, wt, ot, rstd, width, eps);
  else
    rms_norm_kernel<T, 1><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(xt, wt, ot, rstd, width, eps);
  check_launch("rms_norm");
}

template <class T>
void qk_norm_rope_typed(const void* qkv, const void* qn, const void* kn, const float* cos, const float* sin,
                        const int64_t* positions, const int64_t* slots, void* q, void* k, void* v, float* rstd,
                        int64_t tokens, int64_t heads, int64_t kv_heads, int64_t head_dim, float eps,
                        cudaStream_t stream) {
  const int64_t vectors = tokens * (heads + 2 * kv_heads);
  if (vectors == 0) return;
  const auto blocks = static_cast<unsigned>((vectors + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const size_t shared = sizeof(float) * kWarpsPerBlock * static_cast<size_t>(head_dim);
  qk_norm_rope_kernel<T><<<blocks, kWarpsPerBlock * 32, shared, stream>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(qn), static_cast<const T*>(kn), cos, sin, positions, slots,
      static_cast<T*>(q),
      static_cast<T*>(k), static_cast<T*>(v), rstd, tokens, static_cast<int>(heads), static_cast<int>(kv_heads),
      static_cast<int>(head_dim), eps);
  check_launch("qk_norm_rope");
}

template <class T>
void swiglu_typed(const void* gate_up, void* out, int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows * width == 0) return;
  const auto* in = static_cast<const T*>(gate_up);
  auto* o = static_cast<T*>(out);
  constexpr int kThreads = 256;
  if (width % 8 == 0 && aligned16(gate_up) && aligned16(out)) {
    const int64_t packs = rows * (width / 8);
    swiglu_kernel<T, 8><<<static_cast<unsigned>((packs + kThreads - 1) / kThreads), kThreads, 0, stream>>>(in, o, rows, width);
  } else {
    const int64_t packs = rows * width;
    swiglu_kernel<T, 1><<<static_cast<unsigned>((packs + kThreads - 1) / kThreads), kThreads, 0, stream>>>(in, o, rows, width);
  }
  check_launch("swiglu");
}


constexpr int kWeightGradThreads = 128;

int64_t weight_chunks(int64_t rows, int64_t width) {
  const int64_t column_blocks = (width + kWeightGradThreads - 1) / kWeightGradThreads;
  // About 2048 blocks in all, each chunk at least 16 rows.
  int64_t chunks = 2048 / column_blocks;
  if (chunks < 1) chunks = 1;
  const int64_t by_rows = (rows + 15) / 16;
  if (chunks > by_rows) chunks = by_rows;
  return chunks < 1 ? 1 : chunks;
}

template <class T>
void rms_norm_weight_grad_typed(const void* dy, const void* x, const float* rstd, float* partial, int64_t rows,
                                int64_t width, cudaStream_t stream) {
  const int64_t chunks = weight_chunks(rows, width);
  if (rows == 0) {
    cudaMemsetAsync(partial, 0, sizeof(float) * static_cast<size_t>(chunks * width), stream);
    return;
  }
  const int64_t per_chunk = (rows + chunks - 1) / chunks;
  const dim3 grid(static_cast<unsigned>((width + kWeightGradThreads - 1) / kWeightGradThreads), static_cast<unsigned>(chunks));
  rms_norm_weight_grad_kernel<T><<<grid, kWeightGradThreads, 0, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(x), rstd, partial, rows, width, per_chunk);
  check_launch("rms_norm_weight_grad");
}

template <class T>
void rms_norm_backward_typed(const void* dy, const void* x, const void* w, const float* rstd, void* dx, float* partial,
                             int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows > 0) {
    const auto blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    const auto* g = static_cast<const T*>(dy);
    const auto* xt = static_cast<const T*>(x);
    const auto* wt = static_cast<const T*>(w);
    auto* out = static_cast<T*>(dx);
    if (width % 8 == 0 && aligned16(dy) && aligned16(x) && aligned16(w) && aligned16(dx))
      rms_norm_backward_kernel<T, 8><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(g, xt, wt, rstd, out, rows, width);
    else
      rms_norm_backward_kernel<T, 1><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(g, xt, wt, rstd, out, rows, width);
    check_launch("rms_norm_backward");
  }
  rms_norm_weight_grad_typed<T>(dy, x, rstd, partial, rows, width, stream);
}

template <class T>
void head_norm_rope_backward_typed(const void* dout, const void* x, const void* w, const float* rstd, const float* cos,
                                   const float* sin, void* dx, void* dn, int64_t tokens, int64_t heads, int64_t head_dim,
                                   cudaStream_t stream) {
  const int64_t vectors = tokens * heads;
  if (vectors == 0) return;
  const auto blocks = static_cast<unsigned>((vectors + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const size_t shared = sizeof(float) * kWarpsPerBlock * static_cast<size_t>(head_dim);
  head_norm_rope_backward_kernel<T><<<blocks, kWarpsPerBlock * 32, shared, stream>>>(
      static_cast<const T*>(dout), static_cast<const T*>(x), static_cast<const T*>(w), rstd, cos, sin, static_cast<T*>(dx),
      static_cast<T*>(dn), vectors, static_cast<int>(heads), static_cast<int>(head_dim));
  check_launch("head_norm_rope_backward");
}

template <class T>
void swiglu_backward_typed(const void* gate_up, const void* d_out, void* d_gate_up, int64_t rows, int64_t width,
                           cudaStream_t stream) {
  if (rows * width == 0) return;
  const auto* in = static_cast<const T*>(gate_up);
  const auto* d = static_cast<const T*>(d_out);
  auto* o = static_cast<T*>(d_gate_up);
  constexpr int kThreads = 256;
  if (width % 8 == 0 && aligned16(gate_up) && aligned16(d_out) && aligned16(d_gate_up)) {
    const int64_t packs = rows * (width / 8);
    swiglu_backward_kernel<T, 8><<<static_cast<unsigned>((packs + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        in, d, o, rows, width);
  } else {
    const int64_t packs = rows * width;
    swiglu_backward_kernel<T, 1><<<static_cast<unsigned>((packs + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        in, d, o, rows, width);
  }
  check_launch("swiglu_backward");
}


template <class T, int G, int TK>
void launch_invariant_decode_attention(const void* q, const void* keys, const void* values, const int32_t* cu_k,
                                       const int32_t* seqused_k, const DecodeTree& tree, void* out, int64_t tokens,
                                       int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_keys,
                                       cudaStream_t stream) {
  const size_t shared = attention_shared_bytes(head_dim, max_keys, G * TK);
  opt_in_shared_memory(reinterpret_cast<const void*>(invariant_decode_attention_kernel<T, G, TK>), shared,
                       "invariant_decode_attention");
  const int64_t sessions = tokens / n, tiles = (n + TK - 1) / TK;
  const dim3 grid(static_cast<unsigned>(sessions * tiles), static_cast<unsigned>(heads / G));
  invariant_decode_attention_kernel<T, G, TK><<<grid, kAttentionThreads, shared, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(keys), static_cast<const T*>(values), cu_k, seqused_k, tree.rows,
      tree.lengths, static_cast<int>(tree.stride), static_cast<T*>(out), static_cast<int>(n), static_cast<int>(heads),
      static_cast<int>(kv_heads), static_cast<int>(head_dim),
      static_cast<int>(attention_score_stride(head_dim, max_keys)), 1.f / sqrtf(static_cast<float>(head_dim)));
  check_launch("invariant_decode_attention");
}

// A block's queries: G the most query heads of a KV head (a power of two
// dividing the group, up to tiling.max_heads), then TK the most of a step's
// n queries (a power of two, up to tiling.max_queries in all), within the
// shared memory a block gets; then TK halved while one session's grid has
// fewer than tiling.min_blocks blocks. The choice never changes a query's bits.
struct AttentionTile {
  int g = 1, tk = 1;
};
AttentionTile attention_tile(int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_keys,
                             const AttentionTiling& tiling) {
  const auto power_of_two_up_to = [](int x, int most) { return x >= 1 && x <= most && (x & (x - 1)) == 0; };
  if (!power_of_two_up_to(tiling.max_heads, kMaxBlockHeads) || !power_of_two_up_to(tiling.max_queries, kMaxBlockQueries))
    throw std::invalid_argument("invariant_decode_attention: a block's caps must be powers of two, heads up to " +
                                std::to_string(kMaxBlockHeads) + " and queries up to " + std::to_string(kMaxBlockQueries) +
                                " (got " + std::to_string(tiling.max_heads) + " heads, " +
                                std::to_string(tiling.max_queries) + " queries)");
  static const size_t limit = shared_memory_limit();
  const auto fits = [&](int queries) { return attention_shared_bytes(head_dim, max_keys, queries) <= limit; };
  const int64_t group = heads / kv_heads;
  AttentionTile tile;
  while (tile.g * 2 <= std::min(tiling.max_heads, tiling.max_queries) && group % (tile.g * 2) == 0 && fits(tile.g * 2))
    tile.g *= 2;
  while (tile.tk < n && tile.g * tile.tk * 2 <= tiling.max_queries && fits(tile.g * tile.tk * 2)) tile.tk *= 2;
  const auto blocks = [&] { return ((n + tile.tk - 1) / tile.tk) * (heads / tile.g); };
  while (tile.tk > 1 && blocks() < tiling.min_blocks) tile.tk /= 2;
  return tile;
}

template <class T>
void invariant_decode_attention_typed(const void* q, const void* keys, const void* values, const int32_t* cu_k,
                                      const int32_t* seqused_k, const DecodeTree& tree, void* out, int64_t tokens,
                                      int64_t n, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_keys,
                                      cudaStream_t stream, const AttentionTiling& tiling) {
  const AttentionTile tile = attention_tile(n, heads, kv_heads, head_dim, max_keys, tiling);
  if (tokens == 0) return;
  const auto launch = [&](auto g, auto tk) {
    if (tile.g != decltype(g)::value || tile.tk != decltype(tk)::value) return false;
    launch_invariant_decode_attention<T, decltype(g)::value, decltype(tk)::value>(
        q, keys, values, cu_k, seqused_k, tree, out, tokens, n, heads, kv_heads, head_dim, max_keys, stream);
    return true;
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  using I8 = std::integral_constant<int, 8>;
  // Every (G, TK) attention_tile can give: G ≤ 4, G · TK ≤ 8.
  const bool launched = launch(I1{}, I1{}) || launch(I1{}, I2{}) || launch(I1{}, I4{}) || launch(I1{}, I8{}) ||
                        launch(I2{}, I1{}) || launch(I2{}, I2{}) || launch(I2{}, I4{}) || launch(I4{}, I1{}) ||
                        launch(I4{}, I2{});
  if (!launched)
    throw std::logic_error("invariant_decode_attention: no kernel for " + std::to_string(tile.g) + " heads × " +
                           std::to_string(tile.tk) + " tokens a block");
}
}  // namespace

void rms_norm(Element e, const void* x, const void* w, void* out, int64_t rows, int64_t width, float eps,
              cudaStream_t stream, float* rstd) {
  if (e == Element::kBFloat16) rms_norm_typed<__nv_bfloat16>(x, w, out, rstd, rows, width, eps, stream);
  else rms_norm_typed<__half>(x, w, out, rstd, rows, width, eps, stream);
}

void qk_norm_rope(Element e, const void* qkv, const void* q_norm, const void* k_norm, const float* cos,
                  const float* sin, const int64_t* positions, const int64_t* slots, void* q, void* k, void* v,
                  int64_t tokens, int64_t heads, int64_t kv_heads, int64_t head_dim, float eps, cudaStream_t stream,
                  float* rstd) {
  if (e == Element::kBFloat16)
    qk_norm_rope_typed<__nv_bfloat16>(qkv, q_norm, k_norm, cos, sin, positions, slots, q, k, v, rstd, tokens, heads,
                                      kv_heads, head_dim, eps, stream);
  else
    qk_norm_rope_typed<__half>(qkv, q_norm, k_norm, cos, sin, positions, slots, q, k, v, rstd, tokens, heads, kv_heads,
                               head_dim, eps, stream);
}

void swiglu(Element e, const void* gate_up, void* out, int64_t rows, int64_t width, cudaStream_t stream) {
  if (e == Element::kBFloat16) swiglu_typed<__nv_bfloat16>(gate_up, out, rows, width, stream);
  else swiglu_typed<__half>(gate_up, out, rows, width, stream);
}

void rms_norm_backward(Element e, const void* dy, const void* x, const void* weight, const float* rstd, void* dx,
                       float* weight_partial, int64_t rows, int64_t width, cudaStream_t stream) {
  if (e == Element::kBFloat16)
    rms_norm_backward_typed<__nv_bfloat16>(dy, x, weight, rstd, dx, weight_partial, rows, width, stream);
  else
    rms_norm_backward_typed<__half>(dy, x, weight, rstd, dx, weight_partial, rows, width, stream);
}

int64_t rms_norm_weight_chunks(int64_t rows, int64_t width) { return weight_chunks(rows, width); }

void rms_norm_weight_grad(Element e, const void* dy, const void* x, const float* rstd, float* weight_partial, int64_t rows,
                          int64_t width, cudaStream_t stream) {
  if (e == Element::kBFloat16) rms_norm_weight_grad_typed<__nv_bfloat16>(dy, x, rstd, weight_partial, rows, width, stream);
  else rms_norm_weight_grad_typed<__half>(dy, x, rstd, weight_partial, rows, width, stream);
}

void head_norm_rope_backward(Element e, const void* dout, const void* x, const void* weight, const float* rstd,
                             const float* cos, const float* sin, void* dx, void* dn, int64_t tokens, int64_t heads,
                             int64_t head_dim, cudaStream_t stream) {
  if (e == Element::kBFloat16)
    head_norm_rope_backward_typed<__nv_bfloat16>(dout, x, weight, rstd, cos, sin, dx, dn, tokens, heads, head_dim, stream);
  else
    head_norm_rope_backward_typed<__half>(dout, x, weight, rstd, cos, sin, dx, dn, tokens, heads, head_dim, stream);
}

void swiglu_backward(Element e, const void* gate_up, const void* d_out, void* d_gate_up, int64_t rows, int64_t width,
                     cudaStream_t stream) {
  if (e == Element::kBFloat16) swiglu_backward_typed<__nv_bfloat16>(gate_up, d_out, d_gate_up, rows, width, stream);
  else swiglu_backward_typed<__half>(gate_up, d_out, d_gate_up, rows, width, stream);
}

void invariant_decode_attention(Element e, const void* q, const void* keys, const void* values, const int32_t* cu_k,
                                const int32_t* seqused_k, const DecodeTree& tree, void* out, int64_t tokens, int64_t n,
                                int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_keys, cudaStream_t stream,
                                const AttentionTiling& tiling) {
  if (e == Element::kBFloat16)
    invariant_decode_attention_typed<__nv_bfloat16>(q, keys, values, cu_k, seqused_k, tree, out, tokens, n, heads,
                                                    kv_heads, head_dim, max_keys, stream, tiling);
  else
    invariant_decode_attention_typed<__half>(q, keys, values, cu_k, seqused_k, tree, out, tokens, n, heads, kv_heads,
                                             head_dim, max_keys, stream, tiling);
}

bool invariant_decode_attention_fits(int64_t head_dim, int64_t max_keys) {
  if (head_dim % 8 != 0 || head_dim > 256 || head_dim < 8) return false;
  static const size_t limit = shared_memory_limit();
  return attention_shared_bytes(head_dim, max_keys, 1) <= limit;  // a query a block, at the least
}

}  // namespace dflash::cuda_kernels
