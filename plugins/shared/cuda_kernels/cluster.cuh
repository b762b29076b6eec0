// Thread-block clusters (sm_90): a launch whose blocks along z form one
// cluster, the barrier of a cluster's blocks, and the address of another
// block's shared memory. Used by invariant_linear.cu to add its runs of k in
// the blocks' shared memory instead of a workspace in global memory, where
// allowed. The CPU emulation's version: tests/support/cuda_emulation/cluster.cuh
// (a cluster's blocks at once, each its own threads).
#pragma once

#include "device_math.cuh"

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

namespace dflash::cuda_kernels {

// Every block of the cluster arrives, then waits for all: shared-memory
// writes before it are seen by every block's reads after it (release /
// acquire). Not .aligned: a warp may come from a loop its lanes left at
// different turns. Traps below sm_90, where no cluster is launched.
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#else
  __trap();
#endif
}

// `local` (this block's shared memory) as block `rank` of the cluster holds
// it: a generic address a plain load reads across the cluster.
template <class T>
__device__ __forceinline__ const T* cluster_peer_shared(const T* local, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t peer = 0;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(peer) : "l"(reinterpret_cast<uint64_t>(local)), "r"(rank));
  return reinterpret_cast<const T*>(peer);
#else
  __trap();
  return local;
#endif
}

// A launch of `grid` in clusters of grid.z blocks along z; `attribute` (the
// cluster's shape) must outlive the returned config.
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, int threads, size_t shared, cudaStream_t stream,
                                                cudaLaunchAttribute& attribute) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 1;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = grid.z;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

// Whether `kernel` can run with clusters of `cluster_z` blocks along z, each
// `threads` threads and `shared` bytes of dynamic shared memory, on the
// current device: sm_90 or later, at most 16 blocks (above 8 the non-portable
// size, opted in here), and at least one such cluster resident at once
// (cudaOccupancyMaxActiveClusters). Asked of the driver once per device,
// kernel and shape; the kernel's shared-memory opt-in must come first.
inline bool cluster_launch_possible(const void* kernel, int cluster_z, int threads, size_t shared) {
  if (cluster_z < 2 || cluster_z > 16) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (major < 9) return false;
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, int, size_t>, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, kernel, cluster_z, threads, shared);
  if (const auto found = known.find(key); found != known.end()) return found->second;
  bool possible = cluster_z <= 8 ||
                  cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
  if (possible) {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        cluster_launch_config(dim3(1, 1, static_cast<unsigned>(cluster_z)), threads, shared, nullptr, attribute);
    int clusters = 0;
    possible = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) == cudaSuccess && clusters > 0;
  }
  (void)cudaGetLastError();  // a refusal above is an answer, not an error for the next launch check
  known.emplace(key, possible);
  return possible;
}

// kernel<<<grid, threads, shared, stream>>>(args...) with the blocks along z
// in clusters of grid.z (cluster_launch_possible first); throws naming `what`
// if the launch is refused.
template <class... Params, class... Args>
void launch_in_clusters_along_z(const char* what, void (*kernel)(Params...), dim3 grid, int threads, size_t shared,
                                cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_launch_config(grid, threads, shared, stream, attribute);
  const cudaError_t error = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("dflash CUDA kernel ") + what + ": " + cudaGetErrorString(error));
  }
  check_launch(what);
}

}  // namespace dflash::cuda_kernels
