// Thread-block clusters (plugins/shared/cuda_kernels/cluster.cuh) for the CPU
// emulation (cuda_runtime_api.h): none is launched. The emulator runs a
// grid's blocks one at a time, so no block could meet another at a
// cluster's barrier; kernels fall back to their path without clusters
// (invariant_linear's workspace), and the cluster's adding is checked on the
// device (invariant_linear_test.cpp).
#pragma once

#include "cuda_runtime_api.h"

#include <cstddef>
#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {

inline void cluster_barrier() { throw std::logic_error("cluster_barrier: the CPU emulation launches no cluster"); }
template <class T>
const T* cluster_peer_shared(const T*, unsigned) {
  throw std::logic_error("cluster_peer_shared: the CPU emulation launches no cluster");
}
inline bool cluster_launch_possible(const void*, int, int, size_t) { return false; }
template <class... Params, class... Args>
void launch_in_clusters_along_z(const char* what, void (*)(Params...), dim3, int, size_t, cudaStream_t, Args...) {
  throw std::logic_error(std::string(what) + ": the CPU emulation launches no cluster");
}

}  // namespace dflash::cuda_kernels
