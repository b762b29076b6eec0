// What the kernels' code on the current device was compiled with, asked of
// the device itself (cuda_kernels.h): the truth the build's own flags (e.g.
// invariant_linear's choice of products) must agree with.
#include "cuda_kernels.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {
namespace {

// Writes whether this compilation of the library's device code holds
// Hopper's warpgroup MMA (sm_90a's architecture-specific features).
__global__ void wgmma_code_probe(int* out) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

[[noreturn]] void probe_failed(const char* step, cudaError_t error) {
  throw std::runtime_error(std::string("dflash CUDA kernels: the wgmma code probe (") + step +
                           "): " + cudaGetErrorString(error));
}

}  // namespace

bool invariant_linear_device_code_has_wgmma() {
  int* flag = nullptr;
  if (const cudaError_t e = cudaMalloc(&flag, sizeof(int)); e != cudaSuccess) probe_failed("its flag", e);
  wgmma_code_probe<<<1, 1>>>(flag);
  int value = 0;
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t copied = cudaMemcpy(&value, flag, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(flag);
  if (launched != cudaSuccess) probe_failed("launch", launched);
  if (copied != cudaSuccess) probe_failed("read back", copied);
  return value == 1;
}

}  // namespace dflash::cuda_kernels
