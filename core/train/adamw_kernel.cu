#include "train/adamw_kernel.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace dflash::train::adamw_kernel {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements per thread and iteration: one or two 16-byte accesses

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// 8 elements through 16-byte accesses (one for bf16, two for fp32).
template <class T>
struct Eight {
  static constexpr int kPer16 = 16 / sizeof(T);
  struct alignas(16) Part {
    T v[kPer16];
  };
  __device__ static void load(const T* p, float out[kVec]) {
#pragma unroll
    for (int part = 0; part < kVec / kPer16; ++part) {
      const Part x = reinterpret_cast<const Part*>(p)[part];
#pragma unroll
      for (int k = 0; k < kPer16; ++k) out[part * kPer16 + k] = to_float(x.v[k]);
    }
  }
  __device__ static void store(T* p, const float in[kVec]) {
#pragma unroll
    for (int part = 0; part < kVec / kPer16; ++part) {
      Part x;
#pragma unroll
      for (int k = 0; k < kPer16; ++k) x.v[k] = from_float<T>(in[part * kPer16 + k]);
      reinterpret_cast<Part*>(p)[part] = x;
    }
  }
};

// The update of one element, in fp32: decoupled weight decay, then Adam.
__device__ __forceinline__ void update(float& p, float g, float& m, float& v, const Scalars& s, float inv_scale,
                                       float step_size) {
  g *= inv_scale;
  p *= 1.f - s.lr * s.weight_decay;
  m = s.beta1 * m + (1.f - s.beta1) * g;
  v = s.beta2 * v + (1.f - s.beta2) * g * g;
  p -= step_size * m / (sqrtf(v) / s.bias_correction2_sqrt + s.eps);
}

// L: the live dtype (grad, live copy); S: the state dtype (param, m, v).
template <class L, class S, bool kMaster>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const Tensor* __restrict__ tensors, int64_t count, Scalars s) {
  const int64_t chunk = blockIdx.x;
  // The chunk's parameter: the last whose first chunk is at most this one.
  int64_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (tensors[mid].first_chunk <= chunk) lo = mid;
    else hi = mid - 1;
  }
  const Tensor t = tensors[lo];
  const int64_t begin = (chunk - t.first_chunk) * kChunkElements;
  const int64_t end = begin + kChunkElements < t.numel ? begin + kChunkElements : t.numel;
  S* param = static_cast<S*>(t.param);
  const L* grad = static_cast<const L*>(t.grad);
  S* m = static_cast<S*>(t.exp_avg);
  S* v = static_cast<S*>(t.exp_avg_sq);
  L* live = static_cast<L*>(t.live);
  const float inv_scale = s.grad_scale ? 1.f / *s.grad_scale : 1.f;
  const float step_size = s.lr / s.bias_correction1;
  if (t.vectorized) {
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < end; i += static_cast<int64_t>(blockDim.x) * kVec) {
      float p8[kVec], g8[kVec], m8[kVec], v8[kVec];
      Eight<S>::load(param + i, p8);
      Eight<L>::load(grad + i, g8);
      Eight<S>::load(m + i, m8);
      Eight<S>::load(v + i, v8);
#pragma unroll
      for (int k = 0; k < kVec; ++k) update(p8[k], g8[k], m8[k], v8[k], s, inv_scale, step_size);
      Eight<S>::store(param + i, p8);
      Eight<S>::store(m + i, m8);
      Eight<S>::store(v + i, v8);
      if (kMaster) Eight<L>::store(live + i, p8);
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      float p = to_float(param[i]), mm = to_float(m[i]), vv = to_float(v[i]);
      update(p, to_float(grad[i]), mm, vv, s, inv_scale, step_size);
      param[i] = from_float<S>(p);
      m[i] = from_float<S>(mm);
      v[i] = from_float<S>(vv);
      if (kMaster) live[i] = from_float<L>(p);
    }
  }
}

template <class L, class S, bool kMaster>
void launch(const Tensor* tensors, int64_t count, int64_t chunks, const Scalars& s, cudaStream_t stream) {
  adamw_kernel<L, S, kMaster><<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(tensors, count, s);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw std::runtime_error(std::string("AdamW kernel: ") + cudaGetErrorString(status));
}

}  // namespace

void step(Element element, bool master, const Tensor* tensors, int64_t count, int64_t chunks, const Scalars& scalars,
          void* stream) {
  if (count == 0 || chunks == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (element == Element::kBFloat16)
    return master ? launch<__nv_bfloat16, float, true>(tensors, count, chunks, scalars, s)
                  : launch<__nv_bfloat16, __nv_bfloat16, false>(tensors, count, chunks, scalars, s);
  return master ? launch<float, float, true>(tensors, count, chunks, scalars, s)
                : launch<float, float, false>(tensors, count, chunks, scalars, s);
}

}  // namespace dflash::train::adamw_kernel
