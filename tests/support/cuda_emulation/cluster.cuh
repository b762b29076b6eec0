// Thread-block clusters (plugins/shared/cuda_kernels/cluster.cuh) for the CPU
// emulation (cuda_runtime_api.h): a cluster's blocks run at once, each with
// its own threads, barrier and shared memory (launch_clusters); the
// cluster's barrier is a barrier of all their threads, and another block's
// shared memory is the same offset in that block's array.
#pragma once

#include "cuda_runtime_api.h"

#include <cstddef>
#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {

inline void cluster_barrier() { cuda_emulation::current_cluster->meet->arrive_and_wait(); }
template <class T>
const T* cluster_peer_shared(const T* local, unsigned rank) {
  const auto offset = reinterpret_cast<const unsigned char*>(local) - cuda_emulation::shared_window();
  return reinterpret_cast<const T*>(cuda_emulation::current_cluster->shared.at(rank) + offset);
}
// As the device's answer for a cluster that fits: 2 to 16 blocks.
inline bool cluster_launch_possible(const void*, int cluster_z, int, size_t) { return cluster_z >= 2 && cluster_z <= 16; }
template <class... Params, class... Args>
void launch_in_clusters_along_z(const char*, void (*kernel)(Params...), dim3 grid, int threads, size_t, cudaStream_t,
                                Args... args) {
  cuda_emulation::launch_clusters(kernel, grid, threads, grid.z, static_cast<Params>(args)...);
}

}  // namespace dflash::cuda_kernels
