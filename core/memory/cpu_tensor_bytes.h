// The bytes of live CPU tensors, counted as LibTorch allocates and frees
// them: the CPU's counterpart of the CUDA caching allocator's statistics, so
// that a CPU run's measured peak is tensor memory, comparable with the
// planner's prediction, not the process's resident set (which holds the
// libraries, the heap's slack and whatever glibc keeps).
#pragma once

#include <cstdint>

namespace dflash::memory {

// Installs the counting allocator in front of LibTorch's CPU allocator (once;
// later calls do nothing). Tensors allocated before it free as they always
// did, uncounted; call it first thing in main.
void install_cpu_tensor_counter();
bool cpu_tensor_counter_installed();

struct CpuTensorBytes {
  int64_t current = 0, peak = 0;  // peak: since the last reset_cpu_tensor_peak (or the install)
};
CpuTensorBytes cpu_tensor_bytes();
void reset_cpu_tensor_peak();

}  // namespace dflash::memory
