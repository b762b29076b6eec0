// Our fused AdamW kernel: every parameter's update in one launch over
// chunks of 8192 elements, 16-byte loads and stores, fp32 arithmetic,
// one rounding per store. ATen's multi-tensor AdamW takes ~80 launches for
// the 1.73 B-parameter drafter and moves its 24 GB at under half the H200's
// bandwidth (docs/performance.md). Free of LibTorch and CUDA types, so
// adamw.cpp and nvcc each see only what they need.
#pragma once

#include <cstdint>

namespace dflash::train::adamw_kernel {

// The live parameters' (and gradients') dtype. States and masters are that
// dtype (same precision) or fp32 (fp32_master).
enum class Element { kBFloat16, kFloat32 };

// One parameter, as the kernel reads it. `param`, `exp_avg`, `exp_avg_sq`:
// the state dtype; `grad` and `live`: the live dtype. `live` is written from
// the fp32 master (fp32_master only; else null). `first_chunk`: the index of
// the parameter's first chunk in the launch (chunks are kChunkElements).
struct Tensor {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  void* live;
  int64_t numel;
  int64_t first_chunk;
  int64_t vectorized;  // every pointer 16-byte aligned and numel % 8 == 0
};

struct Scalars {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;       // 1 − β1^t
  float bias_correction2_sqrt;  // sqrt(1 − β2^t)
  const float* grad_scale;      // device scalar the gradients are divided by, or null
};

constexpr int64_t kChunkElements = 8192;

// One launch: `tensors` is a device array of `count` Tensor, their chunks
// numbered consecutively from 0 to `chunks`. `master`: states are fp32 and
// `live` is written. `stream`: a cudaStream_t.
void step(Element element, bool master, const Tensor* tensors, int64_t count, int64_t chunks, const Scalars& scalars,
          void* stream);

}  // namespace dflash::train::adamw_kernel
