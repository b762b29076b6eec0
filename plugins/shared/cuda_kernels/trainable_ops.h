// The Qwen3-style layer pieces as autograd functions that save less for
// backward than op-by-op autograd does: what the dflash drafter's training
// forward runs (its `layer_ops: fused`).
//
// Each runs on the shared CUDA kernels (kernel_ops.h: the hf_decoder target's
// RMSNorm, q/k norm + RoPE and SwiGLU, plus their backwards) where
// kernel_ops::runs_on(x), and as ATen closed forms of the same arithmetic
// elsewhere (the CPU, fp32/fp64 on a GPU). Both keep Hugging Face's rounding
// points in the forward (normalise in fp32, round, multiply by the weight)
// and treat them as identity in the backward, as autograd does. The op-by-op
// chain they replace stays in the drafter as its `layer_ops: aten` path, the
// reference the tests compare both against.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>

namespace dflash::trainable_ops {

// kAuto: the CUDA kernels where they run, the closed forms elsewhere;
// kClosedForm: the ATen closed forms everywhere (the tests compare the two).
enum class Path { kAuto, kClosedForm };

// weight ⊙ round(x · rsqrt(mean(x²) + eps)) over the last dimension. Saves x
// and the fp32 per-row rsqrt only (op-by-op autograd saves an fp32 copy of x
// and the normalised tensor besides).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, Path path = Path::kAuto);

// cos and sin of each position's rotary angles θ^(−2i/d)·position, i < d/2:
// [..., d/2] for positions [...], in `dtype` on `device` (computed in fp64).
// One definition of the angles for the drafter's training and decoding.
struct RotaryHalves {
  at::Tensor cos, sin;
};
RotaryHalves rotary_halves(const at::Tensor& positions, int64_t head_dim, double theta, c10::Device device,
                           c10::ScalarType dtype);
// The table dtype head_norm_rope wants for these activations: fp64 for fp64, else fp32.
c10::ScalarType rotary_dtype(c10::ScalarType activations);

// x [..., heads, head_dim] → per-head RMSNorm (weight [head_dim]) then the
// rotary embedding with `rotary` ([..., head_dim/2], the leading dimensions
// x's; rotary_dtype). Saves x, the per-vector rsqrt and the tables; the
// normalised and the rotated tensors are not kept.
at::Tensor head_norm_rope(const at::Tensor& x, const at::Tensor& weight, const RotaryHalves& rotary, double eps,
                          Path path = Path::kAuto);

// The input norm and the projections that read it: h = rms_norm(x,
// norm_weight), then h·Wᵢᵀ for each of the three weights (a layer's q, k
// and v). Saves x and the per-row rsqrt, not h: h is recomputed in backward.
struct Projections {
  at::Tensor first, second, third;  // [..., out_i]
};
Projections norm_projections(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& w1, const at::Tensor& w2,
                             const at::Tensor& w3, double eps, Path path = Path::kAuto);

// A Qwen3-style MLP with its norm and residual: y + down(silu(gate·m) ⊙ up·m),
// m = rms_norm(y, norm_weight). gate and up are computed into one [rows, 2·I]
// buffer, the down projection adds the residual in its GEMM. Saves y, the
// per-row rsqrt and that buffer only: m and silu(gate)⊙up (op-by-op autograd
// keeps those, gate, silu(gate) and up besides) are recomputed in backward.
at::Tensor mlp_block(const at::Tensor& y, const at::Tensor& norm_weight, const at::Tensor& gate, const at::Tensor& up,
                     const at::Tensor& down, double eps, Path path = Path::kAuto);

}  // namespace dflash::trainable_ops
