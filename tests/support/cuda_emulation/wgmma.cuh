// Hopper's warpgroup MMA (plugins/shared/cuda_kernels/wgmma.cuh) for the CPU
// emulation (cuda_runtime_api.h), from the PTX ISA: a descriptor's start
// address, LBO (bytes between core matrices adjacent in k) and SBO (adjacent
// in rows), each >> 4; a core matrix is 8 rows of 16 bytes (8 elements of k);
// the accumulators of m64nNk16 are, for the thread's warp w of its warpgroup
// and lane (group = lane / 4, pair = lane % 4), d[i] at row 16·w + group
// (+8 where i % 4 ≥ 2) of A and row 8·(i / 4) + 2·pair + i % 2 of B. Each
// thread computes its own accumulators from shared memory (the emulator's
// copies are done at once, so the fences, commit and wait have nothing to
// do). As in emulated_mma.h, the 16 products are summed exactly and added
// once: the device's order within an instruction is not modelled.
#pragma once

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime_api.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>

inline size_t __cvta_generic_to_shared(const void* p) {
  return static_cast<size_t>(static_cast<const unsigned char*>(p) - cuda_emulation::shared_window());
}

namespace dflash::cuda_kernels {

inline uint64_t wgmma_descriptor(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32);
}
inline uint64_t wgmma_descriptor_swizzled_128(const void* p, uint32_t sbo) {
  return wgmma_descriptor(p, 16, sbo) | (uint64_t{1} << 62);
}
inline void wgmma_fence() {}
inline void wgmma_commit() {}
inline void wgmma_wait_all() {}
template <int N>
void wgmma_wait_prior() {}
inline void fence_proxy_async_shared() {}
template <int N>
void wgmma_hold(float*) {}

template <class T, int N>
void wgmma_mma(float* d, uint64_t desc_a, uint64_t desc_b) {
  auto element = [](uint64_t desc, int row, int k) {
    const uint64_t start = (desc & 0x3FFF) << 4;
    const uint64_t lbo = ((desc >> 16) & 0x3FFF) << 4, sbo = ((desc >> 32) & 0x3FFF) << 4;
    const uint64_t layout = desc >> 62;  // 0: no swizzle, 1: the 128-byte swizzle
    if (layout > 1) throw std::logic_error("wgmma emulation: only no swizzle and the 128-byte swizzle are modelled");
    uint64_t address;
    if (layout == 1) {  // rows of 128 bytes; bits 4-6 of the address ^= bits 7-9
      address = start + (row / 8) * sbo + (row % 8) * 128 + k * 2;
      address ^= ((address >> 7) & 7) << 4;
    } else {
      address = start + (row / 8) * sbo + (k / 8) * lbo + (row % 8) * 16 + (k % 8) * 2;
    }
    T value;
    std::memcpy(&value, cuda_emulation::shared_window() + address, 2);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(value);
    else return __half2float(value);
  };
  const int t = static_cast<int>(threadIdx.x % 128), warp = t / 32, lane = t % 32;
  for (int i = 0; i < N / 2; ++i) {
    const int m = 16 * warp + lane / 4 + (i % 4 >= 2 ? 8 : 0), n = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    double sum = 0;
    for (int k = 0; k < 16; ++k)
      sum += static_cast<double>(element(desc_a, m, k)) * static_cast<double>(element(desc_b, n, k));
    d[i] += static_cast<float>(sum);
  }
}

}  // namespace dflash::cuda_kernels
