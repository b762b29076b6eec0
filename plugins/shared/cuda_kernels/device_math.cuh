// What every kernel file here uses: conversions between the 16-bit element
// types and fp32 (with transformers' rounding points), 16-byte packs, warp
// and block reductions in a fixed order, and the launch check. Device code
// only; included by the .cu files, never by LibTorch-side sources.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::cuda_kernels {

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
// fp32 elements: no kernel is launched on them, but the CPU emulation's tests
// instantiate a kernel at fp32 to compare its sums bit for bit, before the
// rounding to 16 bits that would hide a change in their order.
__device__ __forceinline__ float to_float(float x) { return x; }
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
// x rounded to T and back: where transformers stores an intermediate in the
// activation dtype, so do we.
template <class T>
__device__ __forceinline__ float rounded(float x) { return to_float(from_float<T>(x)); }

template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Across the warp by a fixed butterfly; every lane gets the result.
template <class Op>
__device__ __forceinline__ float warp_reduce(float x, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffff, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) { return warp_reduce(x, Add{}); }

// Across the block: each warp, then the warps' results in warp order (a
// fixed tree for a given block size); every thread gets the result.
// `identity` fills the lanes past the block's warps.
template <class Op>
__device__ float block_reduce(float x, float identity, Op op) {
  __shared__ float partial[32];
  __shared__ float total;
  x = warp_reduce(x, op);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  if (warp == 0) {
    float y = lane < (blockDim.x + 31) / 32 ? partial[lane] : identity;
    y = warp_reduce(y, op);
    if (lane == 0) total = y;
  }
  __syncthreads();
  return total;
}
__device__ inline float block_sum(float x) { return block_reduce(x, 0.f, Add{}); }
__device__ inline float block_max(float x) { return block_reduce(x, -INFINITY, Max{}); }

// Whether a pointer takes 16-byte (8-element) vector loads.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Throws naming the kernel if its launch failed.
inline void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw std::runtime_error(std::string("dflash CUDA kernel ") + what + ": " + cudaGetErrorString(error));
}

// Opts `kernel` in to `bytes` of dynamic shared memory on the current device
// where that is above the default 48 KiB, per device and per kernel, raised
// when a launch needs more than before. The first launch that needs it must
// not be inside a graph capture (a decoding step's first run is eager).
inline void opt_in_shared_memory(const void* kernel, size_t bytes, const char* what) {
  if (bytes <= 48 * 1024) return;
  struct OptIn {
    int device;
    const void* kernel;
    size_t bytes;
  };
  static std::vector<OptIn> done;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    throw std::runtime_error(std::string("dflash CUDA kernel ") + what + ": no usable current device");
  OptIn* known = nullptr;
  for (OptIn& o : done)
    if (o.device == device && o.kernel == kernel) known = &o;
  if (known != nullptr && known->bytes >= bytes) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) != cudaSuccess)
    check_launch((std::string(what) + " (shared memory opt-in)").c_str());
  if (known != nullptr) known->bytes = bytes;
  else done.push_back({device, kernel, bytes});
}

}  // namespace dflash::cuda_kernels
