#include "cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {
namespace {

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
// x rounded to T and back: where transformers stores an intermediate in the
// activation dtype, so do we.
template <class T>
__device__ __forceinline__ float rounded(float x) { return to_float(from_float<T>(x)); }

template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  return x;
}

// Sum over the block; every thread gets the result.
__device__ float block_sum(float x) {
  __shared__ float partial[32];
  __shared__ float total;
  x = warp_sum(x);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  if (warp == 0) {
    float y = lane < (blockDim.x + 31) / 32 ? partial[lane] : 0.f;
    y = warp_sum(y);
    if (lane == 0) total = y;
  }
  __syncthreads();
  return total;
}

constexpr int kRowThreads = 256;

// One block per row; the row is read twice (the second time from L1/L2).
template <class T, int kVec>
__global__ void rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out,
                                int64_t width, float eps) {
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
template <class T>
__global__ void qk_norm_rope_kernel(const T* __restrict__ qkv, const T* __restrict__ q_norm,
                                    const T* __restrict__ k_norm, const float* __restrict__ cos_table,
                                    const float* __restrict__ sin_table, T* __restrict__ q, T* __restrict__ k,
                                    T* __restrict__ v, int64_t tokens, int heads, int kv_heads, int head_dim,
                                    float eps) {
  extern __shared__ float staged[];  // [kWarpsPerBlock][head_dim]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_token = heads + 2 * kv_heads;
  const int64_t vector = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (vector >= tokens * per_token) return;
  const int64_t token = vector / per_token;
  const int slot = static_cast<int>(vector % per_token);
  const T* src = qkv + vector * head_dim;
  if (slot >= heads + kv_heads) {  // v: a copy into its own contiguous tensor
    T* dst = v + (token * kv_heads + (slot - heads - kv_heads)) * head_dim;
    for (int j = lane; j < head_dim; j += 32) dst[j] = src[j];
    return;
  }
  const bool is_q = slot < heads;
  T* dst = is_q ? q + (token * heads + slot) * head_dim : k + (token * kv_heads + (slot - heads)) * head_dim;
  const T* norm = is_q ? q_norm : k_norm;
  float* y = staged + warp * head_dim;
  if (norm != nullptr) {
    float squares = 0.f;
    for (int j = lane; j < head_dim; j += 32) {
      const float f = to_float(src[j]);
      squares += f * f;
    }
    const float scale = rsqrtf(warp_sum(squares) / static_cast<float>(head_dim) + eps);
    for (int j = lane; j < head_dim; j += 32)
      y[j] = rounded<T>(to_float(norm[j]) * rounded<T>(to_float(src[j]) * scale));
  } else {
    for (int j = lane; j < head_dim; j += 32) y[j] = to_float(src[j]);
  }
  __syncwarp();
  // x·cos + rotate_half(x)·sin, rotate_half(x) = (−x₂, x₁), each product and
  // the sum rounded as transformers' bf16 arithmetic rounds them.
  const int half = head_dim / 2;
  const float* c = cos_table + token * half;
  const float* s = sin_table + token * half;
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

void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw std::runtime_error(std::string("dflash CUDA kernel ") + what + ": " + cudaGetErrorString(error));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class T>
void rms_norm_typed(const void* x, const void* w, void* out, int64_t rows, int64_t width, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  const auto* xt = static_cast<const T*>(x);
  const auto* wt = static_cast<const T*>(w);
  auto* ot = static_cast<T*>(out);
  if (width % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(out))
    rms_norm_kernel<T, 8><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(xt, wt, ot, width, eps);
  else
    rms_norm_kernel<T, 1><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(xt, wt, ot, width, eps);
  check_launch("rms_norm");
}

template <class T>
void qk_norm_rope_typed(const void* qkv, const void* qn, const void* kn, const float* cos, const float* sin, void* q,
                        void* k, void* v, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t head_dim, float eps,
                        cudaStream_t stream) {
  const int64_t vectors = tokens * (heads + 2 * kv_heads);
  if (vectors == 0) return;
  const auto blocks = static_cast<unsigned>((vectors + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const size_t shared = sizeof(float) * kWarpsPerBlock * static_cast<size_t>(head_dim);
  qk_norm_rope_kernel<T><<<blocks, kWarpsPerBlock * 32, shared, stream>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(qn), static_cast<const T*>(kn), cos, sin, static_cast<T*>(q),
      static_cast<T*>(k), static_cast<T*>(v), tokens, static_cast<int>(heads), static_cast<int>(kv_heads),
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

}  // namespace

void rms_norm(Element e, const void* x, const void* w, void* out, int64_t rows, int64_t width, float eps,
              cudaStream_t stream) {
  if (e == Element::kBFloat16) rms_norm_typed<__nv_bfloat16>(x, w, out, rows, width, eps, stream);
  else rms_norm_typed<__half>(x, w, out, rows, width, eps, stream);
}

void qk_norm_rope(Element e, const void* qkv, const void* q_norm, const void* k_norm, const float* cos,
                  const float* sin, void* q, void* k, void* v, int64_t tokens, int64_t heads, int64_t kv_heads,
                  int64_t head_dim, float eps, cudaStream_t stream) {
  if (e == Element::kBFloat16)
    qk_norm_rope_typed<__nv_bfloat16>(qkv, q_norm, k_norm, cos, sin, q, k, v, tokens, heads, kv_heads, head_dim, eps, stream);
  else
    qk_norm_rope_typed<__half>(qkv, q_norm, k_norm, cos, sin, q, k, v, tokens, heads, kv_heads, head_dim, eps, stream);
}

void swiglu(Element e, const void* gate_up, void* out, int64_t rows, int64_t width, cudaStream_t stream) {
  if (e == Element::kBFloat16) swiglu_typed<__nv_bfloat16>(gate_up, out, rows, width, stream);
  else swiglu_typed<__half>(gate_up, out, rows, width, stream);
}

}  // namespace dflash::cuda_kernels
