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

// One thread per (row, token, channel): the taps summed in fp32 in tap
// order and rounded once (as conv1d rounds its output), then SiLU in fp32,
// rounded again (as at::silu on the rounded output).
template <class T>
__global__ void causal_conv_silu_kernel(const T* __restrict__ x, int64_t row_stride, int64_t token_stride,
                                        const T* __restrict__ weight, const T* __restrict__ prefix,
                                        const int32_t* __restrict__ in_document, T* __restrict__ out, int64_t rows,
                                        int64_t seq, int64_t channels, int taps) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * seq * channels) return;
  const int64_t c = index % channels, t = (index / channels) % seq, r = index / (channels * seq);
  // Taps from before the token's document read nothing (in_document: the
  // token's index within its document; null: no document starts in the rows).
  const int64_t reach = in_document != nullptr ? in_document[r * seq + t] : INT64_MAX;
  float sum = 0.f;
  for (int j = 0; j < taps; ++j) {
    const int64_t back = taps - 1 - j;  // how far before t tap j reads
    if (back > reach) continue;
    const int64_t source = t - back;
    float value;
    if (source >= 0) value = to_float(x[r * row_stride + source * token_stride + c]);
    else if (prefix != nullptr) value = to_float(prefix[(r * (taps - 1) + (taps - 1 + source)) * channels + c]);
    else value = 0.f;
    sum += to_float(weight[c * taps + j]) * value;
  }
  const float y = to_float(from_float<T>(sum));
  out[index] = from_float<T>(y / (1.f + expf(-y)));
}

template <class T>
void causal_conv_silu_typed(const void* x, int64_t row_stride, int64_t token_stride, const void* weight,
                            const void* prefix, const int32_t* in_document, void* out, int64_t rows, int64_t seq,
                            int64_t channels, int64_t taps, cudaStream_t stream) {
  const int64_t total = rows * seq * channels;
  if (total == 0) return;
  constexpr int kThreads = 256;
  causal_conv_silu_kernel<T><<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      static_cast<const T*>(x), row_stride, token_stride, static_cast<const T*>(weight), static_cast<const T*>(prefix),
      in_document, static_cast<T*>(out), rows, seq, channels, static_cast<int>(taps));
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
