#include "memory/cpu_tensor_bytes.h"

#include <dflash/sdk/cpu_tensor_counter.hpp>

// The counter itself is the SDK's (one definition, which plugin authors'
// tests install too); the host's names for it.
namespace dflash::memory {

void install_cpu_tensor_counter() { sdk::install_cpu_tensor_counter(); }

bool cpu_tensor_counter_installed() { return sdk::cpu_tensor_counter_installed(); }

CpuTensorBytes cpu_tensor_bytes() {
  const sdk::CpuTensorBytes bytes = sdk::cpu_tensor_bytes();
  return {bytes.current, bytes.peak};
}

void reset_cpu_tensor_peak() { sdk::reset_cpu_tensor_peak(); }

}  // namespace dflash::memory
