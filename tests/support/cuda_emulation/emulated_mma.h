// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} for the CPU emulation
// (cuda_runtime_api.h), from the PTX ISA's fragment layouts: lane (group =
// lane / 4, pair = lane % 4) holds A rows group and group + 8, k 2·pair + {0,1}
// and + 8 (a[0] row group, a[1] row group + 8, a[2]/a[3] the same at k + 8),
// B column group at k 2·pair + {0,1} (b[0]) and + 8 (b[1]), and D rows group
// (d[0], d[1]) and group + 8 (d[2], d[3]) at columns 2·pair + {0,1}. The
// lower-numbered element of a pair is the register's low half. The 16
// products are summed exactly (double) and added to D once: the device's own
// order within an instruction is not modelled, only which values meet.
#pragma once

#include "cuda_bf16.h"
#include "cuda_fp16.h"

#include <type_traits>

namespace cuda_emulation {

template <class T>
float element(uint32_t reg, int high) {
  const uint16_t bits = high ? static_cast<uint16_t>(reg >> 16) : static_cast<uint16_t>(reg & 0xffffu);
  T value;
  std::memcpy(&value, &bits, 2);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(value);
  else return __half2float(value);
}

template <class T>
void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int lane = static_cast<int>(threadIdx.x % 32), warp_index = static_cast<int>(threadIdx.x / 32);
  Warp& warp = *block_warps()[static_cast<size_t>(warp_index)];
  const int buffer = warp.mma_buffer[lane];
  warp.mma_buffer[lane] ^= 1;
  for (int i = 0; i < 4; ++i) warp.a[buffer][lane][i] = a[i];
  warp.b[buffer][lane][0] = b[0];
  warp.b[buffer][lane][1] = b[1];
  warp.meet.arrive_and_wait();
  auto a_at = [&](int row, int k) {
    const int holder = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return element<T>(warp.a[buffer][holder][reg], k % 2);
  };
  auto b_at = [&](int k, int column) {
    return element<T>(warp.b[buffer][column * 4 + (k % 8) / 2][k >= 8 ? 1 : 0], k % 2);
  };
  const int group = lane / 4, pair = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = group + (e >= 2 ? 8 : 0), column = 2 * pair + (e & 1);
    double sum = 0;
    for (int k = 0; k < 16; ++k) sum += static_cast<double>(a_at(row, k)) * static_cast<double>(b_at(k, column));
    d[e] += static_cast<float>(sum);
  }
}

}  // namespace cuda_emulation
