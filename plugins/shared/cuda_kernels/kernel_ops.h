// The CUDA kernels of cuda_kernels.h on LibTorch tensors: what the hf_decoder
// target's GPU path and the dflash drafter's fused decoding call. Each call
// runs on the current CUDA stream of its input's device, allocates only its
// outputs and never waits for the device, so it can be captured in a CUDA graph.
//
// Against a CPU LibTorch (DFLASH_CUDA_KERNELS 0) available() is false and
// every other call throws: callers keep their ATen reference path, which is
// also what the kernels are tested against.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dflash::kernel_ops {

// Whether this build carries the kernels (a CUDA LibTorch and a CUDA compiler).
bool available();

// Whether the kernels take these activations: a CUDA tensor of bf16 or fp16
// (and a build that has them).
bool runs_on(const at::Tensor& like);

// x [..., width] → weight ⊙ RMSNorm(x), Hugging Face's rounding; the same shape as x.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

struct HeadTensors {
  at::Tensor q, k, v;  // [tokens, heads, head_dim], [tokens, kv_heads, head_dim] ×2, contiguous
};

// The fused projection's output [tokens, (heads + 2·kv_heads)·head_dim] → q and k
// with the optional per-head RMSNorm (undefined weights: none) and the rotary
// embedding (cos/sin: contiguous fp32 [tokens, head_dim/2], row t for token t),
// and v. heads = 0 takes a [k; v] projection (q is then empty).
HeadTensors qk_norm_rope(const at::Tensor& qkv, const at::Tensor& q_norm, const at::Tensor& k_norm,
                         const at::Tensor& cos, const at::Tensor& sin, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, double eps);

// gate_up [rows, 2·width] → silu(gate) ⊙ up [rows, width].
at::Tensor swiglu(const at::Tensor& gate_up);

}  // namespace dflash::kernel_ops
