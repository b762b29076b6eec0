// cp.async for the CPU emulation (cuda_runtime_api.h): the copy happens at
// once, so committing and waiting have nothing to do.
#pragma once

#include "cuda_runtime_api.h"

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes, size_t zero_fill = 0) {
  std::memcpy(dst, src, bytes - zero_fill);
  if (zero_fill > 0) std::memset(static_cast<char*>(dst) + bytes - zero_fill, 0, zero_fill);
}
inline void __pipeline_commit() {}
inline void __pipeline_wait_prior(size_t) {}
