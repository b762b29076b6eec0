// CUDA on the CPU, for tests only: enough of the runtime to run a kernel's
// own source, each block's threads as std::threads (launch), so CI
// machines without a GPU check a kernel's indexing and its arithmetic order.
// Blocks run one at a time (a cluster's at once: launch_clusters), so a
// function-local static is the block's shared memory (`__shared__`); the
// dynamic `extern __shared__` array is each block's own (dynamic_shared);
// __syncthreads is a barrier of the block's threads, and cp.async
// (cuda_pipeline.h) copies at once. What it
// does not model: timing, memory ordering between blocks, and warp-wide
// instructions other than emulated_mma (emulated_mma.h).
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

using cudaStream_t = void*;
enum cudaError_t { cudaSuccess = 0 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
enum cudaDeviceAttr {
  cudaDevAttrMaxSharedMemoryPerBlockOptin,
  cudaDevAttrComputeCapabilityMajor,
  cudaDevAttrComputeCapabilityMinor
};
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
template <class Function>
cudaError_t cudaFuncSetAttribute(Function*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
inline cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
// An H100's: 227 KiB of opt-in shared memory, compute capability 9.0.
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  *value = attribute == cudaDevAttrMaxSharedMemoryPerBlockOptin ? 227 * 1024
           : attribute == cudaDevAttrComputeCapabilityMajor     ? 9
                                                                : 0;
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t = nullptr) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }
// x86-64's SSE float arithmetic rounds each operation to nearest even, as
// these intrinsics do (no contraction: the tests build without -ffast-math).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }

namespace cuda_emulation {

// One warp's meeting point for warp-wide instructions: each lane leaves its
// operands, all wait, each reads what it needs, all wait again. The mma's
// operands alternate between two buffers, so it meets once: a lane can only
// write a buffer again after every lane has met at the mma in between, that
// is, after each has read it.
struct Warp {
  std::barrier<> meet{32};
  uint32_t a[2][32][4];
  uint32_t b[2][32][2];
  int mma_buffer[32] = {};
  float value[32];
};

// The size of a block's dynamic shared array.
constexpr size_t kDynamicSharedBytes = 256 * 1024;
// Blocks' dynamic shared arrays, kept for the next launch rather than
// allocated (and their pages faulted in) anew for each. 1024-aligned, as the
// swizzled wgmma layouts need.
class SharedArrays {
 public:
  static unsigned char* take() {
    const std::lock_guard<std::mutex> lock(mutex());
    if (free().empty()) return static_cast<unsigned char*>(std::aligned_alloc(1024, kDynamicSharedBytes));
    unsigned char* array = free().back();
    free().pop_back();
    return array;
  }
  static void give_back(unsigned char* array) {
    const std::lock_guard<std::mutex> lock(mutex());
    free().push_back(array);
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<unsigned char*>& free() {
    static std::vector<unsigned char*> arrays;
    return arrays;
  }
};
// A running block's own state: its warps, its barrier (__syncthreads) and
// its dynamic shared memory (the `extern __shared__` array, which
// emulate_kernel_source.py turns into dynamic_shared()). Each thread points
// at its block's through thread_locals, so the blocks of a cluster can run
// at once (launch_clusters).
struct Block {
  std::vector<std::unique_ptr<Warp>> warps;
  std::unique_ptr<std::barrier<>> barrier;
  unsigned char* shared = SharedArrays::take();
  explicit Block(int threads) : barrier(std::make_unique<std::barrier<>>(threads)) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<Warp>());
  }
  ~Block() { SharedArrays::give_back(shared); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
};
// A running cluster: each block's shared memory by rank, and the barrier all
// its blocks' threads meet at.
struct Cluster {
  std::vector<unsigned char*> shared;
  std::unique_ptr<std::barrier<>> meet;
};
inline thread_local Block* current_block = nullptr;
inline thread_local Cluster* current_cluster = nullptr;
inline std::vector<std::unique_ptr<Warp>>& block_warps() { return current_block->warps; }

// The running block's dynamic shared array, address 0 of the shared window
// (__cvta_generic_to_shared, wgmma.cuh's descriptors).
inline unsigned char* shared_window() { return current_block->shared; }
template <class Element>
Element* dynamic_shared() {
  return reinterpret_cast<Element*>(current_block->shared);
}

// kernel<<<grid, threads, shared, stream>>>(args...) with the blocks along z
// in clusters of cluster_z (a divisor of grid.z): a cluster's blocks run at
// once, each its own threads and state, and the clusters one after another.
// The threads are made once per launch and run every cluster in turn,
// meeting between clusters (making them per block cost most of the emulated
// tests' time). A kernel launched in clusters of more than one keeps its
// shared memory in the dynamic array (a function-local `__shared__` static
// would be every block's at once).
template <class Kernel, class... Args>
void launch_clusters(Kernel kernel, dim3 grid, int threads, unsigned cluster_z, Args... args) {
  std::vector<std::unique_ptr<Block>> blocks;
  Cluster cluster;
  for (unsigned r = 0; r < cluster_z; ++r) {
    blocks.push_back(std::make_unique<Block>(threads));
    cluster.shared.push_back(blocks.back()->shared);
  }
  const int all = threads * static_cast<int>(cluster_z);
  cluster.meet = std::make_unique<std::barrier<>>(all);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(all));
  for (int t = 0; t < all; ++t)
    pool.emplace_back([&, t] {
      const unsigned rank = static_cast<unsigned>(t / threads);
      threadIdx = dim3(static_cast<unsigned>(t % threads));
      blockDim = dim3(static_cast<unsigned>(threads));
      gridDim = grid;
      current_block = blocks[rank].get();
      current_cluster = &cluster;
      for (unsigned z = 0; z < grid.z; z += cluster_z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) {
            blockIdx = dim3(x, y, z + rank);
            kernel(args...);
            cluster.meet->arrive_and_wait();
          }
    });
  for (std::thread& thread : pool) thread.join();
}

// kernel<<<grid, threads, shared, stream>>>(args...): blocks one after
// another (clusters of one).
template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, int threads, Args... args) {
  launch_clusters(kernel, grid, threads, 1, args...);
}

}  // namespace cuda_emulation

inline void __syncthreads() { cuda_emulation::current_block->barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  cuda_emulation::block_warps()[threadIdx.x / 32]->meet.arrive_and_wait();
}
// Every lane of the warp takes part (the mask is not modelled).
inline float __shfl_xor_sync(unsigned, float x, int lane_mask) {
  cuda_emulation::Warp& warp = *cuda_emulation::block_warps()[threadIdx.x / 32];
  const unsigned lane = threadIdx.x % 32;
  warp.value[lane] = x;
  warp.meet.arrive_and_wait();
  const float y = warp.value[lane ^ static_cast<unsigned>(lane_mask)];
  warp.meet.arrive_and_wait();
  return y;
}
