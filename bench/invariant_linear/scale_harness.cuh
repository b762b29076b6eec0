// What tiling_sweep.cu and wgmma_probe.cu share: the scale model's
// projections (DFLASH_DEMO_SCALE=16 on the demo target: hidden 8192,
// intermediate 24576, 32/16 heads of 64, vocabulary 8192), their weights in
// copies past 512 MB so that no timed call finds them in L2, bf16 filled by a
// hash, and the mean of 20 timed calls after 3 untimed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

namespace scale_harness {

using Bf = __nv_bfloat16;

struct Shape {
  const char* name;
  int64_t out, in;
};
inline std::vector<Shape> scale_shapes() {
  return {{"qkv", 4096, 8192}, {"o", 8192, 2048}, {"gate_up", 49152, 8192}, {"down", 8192, 24576}, {"lm_head", 8192, 8192}};
}

__global__ void fill(Bf* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * scale);
  }
}

inline Bf* filled(int64_t n, uint32_t seed, float scale) {
  Bf* p = nullptr;
  CK(cudaMalloc(&p, n * 2));
  fill<<<1024, 256>>>(p, n, seed, scale);
  return p;
}

// A shape's weight in copies past 512 MB, all the same values; call i reads copy i % size.
struct RotatingWeights {
  std::vector<Bf*> copies;
  explicit RotatingWeights(const Shape& s) {
    const int64_t n = s.out * s.in, count = std::max<int64_t>(1, (512ll << 20) / (n * 2) + 1);
    for (int64_t i = 0; i < count; ++i) copies.push_back(filled(n, 7, 0.1f));
  }
  ~RotatingWeights() {
    for (Bf* p : copies) cudaFree(p);
  }
  const Bf* operator[](int i) const { return copies[static_cast<size_t>(i) % copies.size()]; }
};

// µs a call of f(i) on `stream`: 3 untimed, then the mean of 20.
inline double time_calls(cudaStream_t stream, const std::function<void(int)>& f) {
  static cudaEvent_t start = nullptr, stop = nullptr;
  if (start == nullptr) {
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&stop));
  }
  for (int i = 0; i < 3; ++i) f(i);
  CK(cudaEventRecord(start, stream));
  for (int i = 0; i < 20; ++i) f(i + 3);
  CK(cudaEventRecord(stop, stream));
  CK(cudaEventSynchronize(stop));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, start, stop));
  return ms * 1000.0 / 20;
}

}  // namespace scale_harness
