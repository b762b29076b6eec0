// The allocator's current and peak bytes where the drafter trains: the CUDA
// caching allocator on a GPU; on the CPU the counted tensor bytes
// (cpu_tensor_bytes.h) where dflash-host installed the counter, else the
// process's resident set.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace dflash::memory {

struct MemoryFigures {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;  // since the last reset_peak (or the process start)
  int64_t reserved_bytes = 0;  // CUDA: held by the caching allocator (allocated + cached); CPU: 0
  std::string source;      // "cuda_allocator", "cpu_allocator" or "process_rss"
};

MemoryFigures memory_now(const c10::Device& device);
void reset_peak(const c10::Device& device);

// The cuBLAS workspace LibTorch gives every CUDA stream that runs a GEMM
// (allocated through the caching allocator on first use, kept for the
// process: CUBLAS_WORKSPACE_CONFIG, or LibTorch's default for the device —
// 32 MiB on Hopper with LibTorch 2.11). 0 for the CPU or a build without CUDA.
int64_t gemm_workspace_bytes(const c10::Device& device);

}  // namespace dflash::memory
