// Gated DeltaNet's causal depthwise convolution with SiLU (cuda_kernels.h):
// one pass from the projection's rows to the activations, where ATen
// concatenates the window, transposes, convolves, transposes back and
// applies SiLU (five passes), and then fixes up each document's first taps.
#include "cuda_kernels.h"
#include "device_math.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {
namespace {

constexpr int kMaxTaps = 8;
// Tokens one thread walks: its window of the last taps − 1 inputs stays in
// registers, so each input is read once (plus taps − 1 at the tile's start).
constexpr int kTileTokens = 32;
constexpr int kThreads = 128;

// A thread owns kVec adjacent channels of one row over kTileTokens tokens
// (grid: x channel groups, y token tiles, z rows — no 64-bit division per
// value, which cost the one-thread-per-value form 5.6 ms a layer at the
// Qwen3.6 shape). Each value is the taps summed in fp32 in tap order and
// rounded once (as conv1d rounds its output), then SiLU in fp32, rounded
// again (as at::silu on the rounded output).
template <class T, int kTaps, int kVec>
__global__ void __launch_bounds__(kThreads)
    causal_conv_silu_kernel(const T* __restrict__ x, int64_t row_stride, int64_t token_stride,
                            const T* __restrict__ weight, const T* __restrict__ prefix,
                            const int32_t* __restrict__ in_document, T* __restrict__ out, int64_t seq,
                            int64_t channels) {
  using Vec = Pack<T, kVec>;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kVec;
  if (c0 >= channels) return;
  const int64_t r = blockIdx.z;
  const int64_t t_begin = static_cast<int64_t>(blockIdx.y) * kTileTokens;
  const int64_t t_end = t_begin + kTileTokens < seq ? t_begin + kTileTokens : seq;
  const T* row = x + r * row_stride + c0;
  float w[kTaps][kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i)
#pragma unroll
    for (int j = 0; j < kTaps; ++j) w[j][i] = to_float(weight[(c0 + i) * kTaps + j]);
  // window[k]: the input at t − (kTaps − 1) + k for the token t about to be
  // computed; before the row, the prefix (or zeros).
  float window[kTaps > 1 ? kTaps - 1 : 1][kVec];
#pragma unroll
  for (int k = 0; k < kTaps - 1; ++k) {
    const int64_t source = t_begin - (kTaps - 1) + k;
    Vec v;
    if (source >= 0)
      v = *reinterpret_cast<const Vec*>(row + source * token_stride);
    else if (prefix != nullptr)
      v = *reinterpret_cast<const Vec*>(prefix + (r * (kTaps - 1) + (kTaps - 1 + source)) * channels + c0);
    else
#pragma unroll
      for (int i = 0; i < kVec; ++i) v.v[i] = from_float<T>(0.f);
#pragma unroll
    for (int i = 0; i < kVec; ++i) window[k][i] = to_float(v.v[i]);
  }
  for (int64_t t = t_begin; t < t_end; ++t) {
    const Vec input = *reinterpret_cast<const Vec*>(row + t * token_stride);
    float current[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) current[i] = to_float(input.v[i]);
    // Taps from before the token's document read nothing (in_document: the
    // token's index within its document; null: no document starts in the rows).
    const int64_t reach = in_document != nullptr ? in_document[r * seq + t] : INT64_MAX;
    Vec result;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kTaps; ++j) {
        const int back = kTaps - 1 - j;  // how far before t tap j reads
        if (back > reach) continue;
        sum += w[j][i] * (j == kTaps - 1 ? current[i] : window[j][i]);
      }
      const float y = rounded<T>(sum);
      result.v[i] = from_float<T>(y / (1.f + expf(-y)));
    }
    *reinterpret_cast<Vec*>(out + (r * seq + t) * channels + c0) = result;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
#pragma unroll
      for (int k = 0; k + 1 < kTaps - 1; ++k) window[k][i] = window[k + 1][i];
      if (kTaps > 1) window[kTaps - 2][i] = current[i];
    }
  }
}

template <class T, int kTaps, int kVec>
void launch_conv(const void* x, int64_t row_stride, int64_t token_stride, const void* weight, const void* prefix,
                 const int32_t* in_document, void* out, int64_t rows, int64_t seq, int64_t channels,
                 cudaStream_t stream) {
  const int64_t groups = (channels + kVec - 1) / kVec;
  const dim3 grid(static_cast<unsigned>((groups + kThreads - 1) / kThreads),
                  static_cast<unsigned>((seq + kTileTokens - 1) / kTileTokens), static_cast<unsigned>(rows));
  causal_conv_silu_kernel<T, kTaps, kVec><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(x), row_stride, token_stride, static_cast<const T*>(weight),
      static_cast<const T*>(prefix), in_document, static_cast<T*>(out), seq, channels);
}

// kVec = 8 (16-byte loads and stores) where every row, token and pointer is
// 16-byte aligned and the channels split into whole groups; one channel a
// thread otherwise.
template <class T, int kTaps>
void launch_conv_aligned(const void* x, int64_t row_stride, int64_t token_stride, const void* weight,
                         const void* prefix, const int32_t* in_document, void* out, int64_t rows, int64_t seq,
                         int64_t channels, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vector = channels % 8 == 0 && row_stride % 8 == 0 && token_stride % 8 == 0 && aligned(x) &&
                      aligned(out) && (prefix == nullptr || aligned(prefix));
  if (vector)
    launch_conv<T, kTaps, 8>(x, row_stride, token_stride, weight, prefix, in_document, out, rows, seq, channels,
                             stream);
  else
    launch_conv<T, kTaps, 1>(x, row_stride, token_stride, weight, prefix, in_document, out, rows, seq, channels,
                             stream);
}

template <class T>
void causal_conv_silu_typed(const void* x, int64_t row_stride, int64_t token_stride, const void* weight,
                            const void* prefix, const int32_t* in_document, void* out, int64_t rows, int64_t seq,
                            int64_t channels, int64_t taps, cudaStream_t stream) {
  if (rows * seq * channels == 0) return;
  if (rows > 65535 || (seq + kTileTokens - 1) / kTileTokens > 65535)
    throw std::invalid_argument("causal_conv_silu: " + std::to_string(rows) + " rows of " + std::to_string(seq) +
                                " tokens exceed the launch grid (65,535 rows, 2,097,120 tokens a row)");
  switch (taps) {
#define DFLASH_CONV_TAPS(n)                                                                                      \
  case n:                                                                                                        \
    launch_conv_aligned<T, n>(x, row_stride, token_stride, weight, prefix, in_document, out, rows, seq, channels, \
                              stream);                                                                           \
    break;
    DFLASH_CONV_TAPS(1)
    DFLASH_CONV_TAPS(2)
    DFLASH_CONV_TAPS(3)
    DFLASH_CONV_TAPS(4)
    DFLASH_CONV_TAPS(5)
    DFLASH_CONV_TAPS(6)
    DFLASH_CONV_TAPS(7)
    DFLASH_CONV_TAPS(8)
#undef DFLASH_CONV_TAPS
  }
  check_launch("causal_conv_silu");
}

}  // namespace

void causal_conv_silu(Element e, const void* x, int64_t row_stride, int64_t token_stride, const void* weight,
                      const void* prefix, const int32_t* in_document, void* out, int64_t rows, int64_t seq,
                      int64_t channels, int64_t taps, cudaStream_t stream) {
  if (taps < 1 || taps > kMaxTaps)
    throw std::invalid_argument("causal_conv_silu: " + std::to_string(taps) + " taps (at most " +
                                std::to_string(kMaxTaps) + ")");
  if (e == Element::kBFloat16)
    causal_conv_silu_typed<__nv_bfloat16>(x, row_stride, token_stride, weight, prefix, in_document, out, rows, seq,
                                          channels, taps, stream);
  else
    causal_conv_silu_typed<__half>(x, row_stride, token_stride, weight, prefix, in_document, out, rows, seq, channels,
                                   taps, stream);
}

}  // namespace dflash::cuda_kernels
