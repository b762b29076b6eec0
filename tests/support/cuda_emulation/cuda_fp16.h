// fp16 for the CPU emulation (cuda_runtime_api.h), through the compiler's _Float16.
#pragma once

#include "cuda_runtime_api.h"

struct __half {
  uint16_t bits;
};
inline float __half2float(__half h) {
  _Float16 v;
  std::memcpy(&v, &h.bits, 2);
  return static_cast<float>(v);
}
inline __half __float2half(float f) {
  const _Float16 v = static_cast<_Float16>(f);
  __half h;
  std::memcpy(&h.bits, &v, 2);
  return h;
}
