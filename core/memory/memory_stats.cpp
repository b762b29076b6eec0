#include "memory/memory_stats.h"

#include "memory/cpu_tensor_bytes.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

#if DFLASH_HOST_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dflash::memory {

MemoryFigures memory_now(const c10::Device& device) {
  MemoryFigures m;
#if DFLASH_HOST_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    m.current_bytes = stats.allocated_bytes[0].current;
    m.peak_bytes = stats.allocated_bytes[0].peak;
    m.reserved_bytes = stats.reserved_bytes[0].current;
    m.source = "cuda_allocator";
    return m;
  }
#endif
  if (cpu_tensor_counter_installed()) {  // tensor bytes, as the CUDA allocator counts them
    const CpuTensorBytes counted = cpu_tensor_bytes();
    m.current_bytes = counted.current;
    m.peak_bytes = counted.peak;
    m.source = "cpu_allocator";
    return m;
  }
  (void)device;
  long pages = 0, resident = 0;
  std::ifstream statm("/proc/self/statm");
  statm >> pages >> resident;
  m.current_bytes = static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE);
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  m.peak_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  m.source = "process_rss";
  return m;
}

void reset_peak(const c10::Device& device) {
#if DFLASH_HOST_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
#endif
  if (!device.is_cuda()) reset_cpu_tensor_peak();
}

int64_t gemm_workspace_bytes(const c10::Device& device) {
#if DFLASH_HOST_CUDA
  if (device.is_cuda() && c10::cuda::device_count() > 0) {
    // LibTorch sizes it by the current device's properties.
    const c10::DeviceIndex previous = c10::cuda::current_device();
    c10::cuda::set_device(device.has_index() ? device.index() : 0);
    const auto bytes = static_cast<int64_t>(at::cuda::getChosenWorkspaceSize());
    c10::cuda::set_device(previous);
    return bytes;
  }
#endif
  (void)device;
  return 0;
}

}  // namespace dflash::memory
