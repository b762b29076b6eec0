// The two norms of the Qwen3.5 / Qwen3.6 layers (cuda_kernels.h), each one
// pass over its rows instead of ATen's fp32 copy, square, mean, scale and
// round (four to six passes over a [tokens, width] fp32 temporary).
#include "cuda_kernels.h"
#include "device_math.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {
namespace {

constexpr int kRowThreads = 256;

// One block per row: out = round(x · rsqrt(mean(x²) + eps) · scale), the
// product formed in fp32 and rounded once (transformers' Qwen3_5RMSNorm,
// scale = 1 + w in fp32).
template <class T, int kVec>
__global__ void rms_norm_scaled_kernel(const T* __restrict__ x, const float* __restrict__ scale, T* __restrict__ out,
                                       int64_t width, float eps) {
  using P = Pack<T, kVec>;
  const P* row = reinterpret_cast<const P*>(x + static_cast<int64_t>(blockIdx.x) * width);
  P* dst = reinterpret_cast<P*>(out + static_cast<int64_t>(blockIdx.x) * width);
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
  const float r = rsqrtf(block_sum(squares) / static_cast<float>(width) + eps);
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const P v = row[p];
    P y;
#pragma unroll
    for (int i = 0; i < kVec; ++i) y.v[i] = from_float<T>(to_float(v.v[i]) * r * scale[p * kVec + i]);
    dst[p] = y;
  }
}

// One warp per row (a token's value head): transformers' Qwen3_5RMSNormGated,
// round(round(w · round(x̂)) · SiLU(z)) with x̂ and SiLU in fp32.
template <class T>
__global__ void gated_rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ gate, const T* __restrict__ weight,
                                      T* __restrict__ out, int64_t rows, int heads, int width, int64_t gate_stride,
                                      float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const T* src = x + row * width;
  const T* z = gate + (row / heads) * gate_stride + (row % heads) * width;
  float squares = 0.f;
  for (int j = lane; j < width; j += 32) {
    const float f = to_float(src[j]);
    squares += f * f;
  }
  const float r = rsqrtf(warp_sum(squares) / static_cast<float>(width) + eps);
  T* dst = out + row * width;
  for (int j = lane; j < width; j += 32) {
    const float normed = rounded<T>(to_float(weight[j]) * rounded<T>(to_float(src[j]) * r));
    const float g = to_float(z[j]);
    dst[j] = from_float<T>(normed * (g / (1.f + expf(-g))));
  }
}

template <class T>
void rms_norm_scaled_typed(const void* x, const float* scale, void* out, int64_t rows, int64_t width, float eps,
                           cudaStream_t stream) {
  if (rows == 0) return;
  const auto* xt = static_cast<const T*>(x);
  auto* ot = static_cast<T*>(out);
  const bool vec = width % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) rms_norm_scaled_kernel<T, 8><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(xt, scale, ot, width, eps);
  else rms_norm_scaled_kernel<T, 1><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(xt, scale, ot, width, eps);
  check_launch("rms_norm_scaled");
}

template <class T>
void gated_rms_norm_typed(const void* x, const void* gate, const void* weight, void* out, int64_t rows, int64_t heads,
                          int64_t width, int64_t gate_stride, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  constexpr int kRowsPerBlock = 8;
  gated_rms_norm_kernel<T><<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0,
                             stream>>>(static_cast<const T*>(x), static_cast<const T*>(gate),
                                       static_cast<const T*>(weight), static_cast<T*>(out), rows,
                                       static_cast<int>(heads), static_cast<int>(width), gate_stride, eps);
  check_launch("gated_rms_norm");
}

}  // namespace

void rms_norm_scaled(Element e, const void* x, const float* scale, void* out, int64_t rows, int64_t width, float eps,
                     cudaStream_t stream) {
  if (e == Element::kBFloat16) rms_norm_scaled_typed<__nv_bfloat16>(x, scale, out, rows, width, eps, stream);
  else rms_norm_scaled_typed<__half>(x, scale, out, rows, width, eps, stream);
}

void gated_rms_norm(Element e, const void* x, const void* gate, const void* weight, void* out, int64_t rows,
                    int64_t heads, int64_t width, int64_t gate_stride, float eps, cudaStream_t stream) {
  if (e == Element::kBFloat16)
    gated_rms_norm_typed<__nv_bfloat16>(x, gate, weight, out, rows, heads, width, gate_stride, eps, stream);
  else
    gated_rms_norm_typed<__half>(x, gate, weight, out, rows, heads, width, gate_stride, eps, stream);
}

}  // namespace dflash::cuda_kernels
