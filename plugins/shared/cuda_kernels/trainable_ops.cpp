#include "trainable_ops.h"

#include "kernel_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

namespace dflash::trainable_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool kernels_for(const at::Tensor& x, Path path) { return path == Path::kAuto && kernel_ops::runs_on(x); }
// fp64 stays fp64; everything else is normalised in fp32 (Hugging Face's arithmetic).
at::ScalarType statistics_type(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// ---- The closed forms (ATen) ------------------------------------------------

struct Normalised {
  at::Tensor out, rstd;  // rstd: x's shape without its last dimension
};

Normalised rms_forward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor f = x.to(statistics_type(x));
  const at::Tensor rstd = at::rsqrt(f.pow(2).mean(-1) + eps);
  return {weight * (f * rstd.unsqueeze(-1)).to(x.scalar_type()), rstd};
}

// The normalised x̂ = x·rstd in the statistics dtype.
at::Tensor normalised(const at::Tensor& x, const at::Tensor& rstd) {
  return x.to(rstd.scalar_type()) * rstd.unsqueeze(-1);
}

// x's gradient from x̂'s (g, statistics dtype): rstd·(g − x̂·mean(g ⊙ x̂)).
at::Tensor through_normalisation(const at::Tensor& g, const at::Tensor& xhat, const at::Tensor& rstd) {
  return rstd.unsqueeze(-1) * (g - xhat * (g * xhat).mean(-1, true));
}

// The gradients of weight ⊙ round(x̂) given the output's gradient dy.
kernel_ops::NormBackward rms_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                      const at::Tensor& rstd) {
  const at::Tensor xhat = normalised(x, rstd), g = dy.to(rstd.scalar_type());
  const at::Tensor dx = through_normalisation(g * weight.to(rstd.scalar_type()), xhat, rstd).to(x.scalar_type());
  const at::Tensor dweight =
      (g * xhat.to(x.scalar_type()).to(rstd.scalar_type())).reshape({-1, x.size(-1)}).sum(0).to(weight.scalar_type());
  return {dx, dweight};
}

// rotate_half(x) = (−x₂, x₁) and its transpose (z₂, −z₁).
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}
at::Tensor rotate_half_transposed(const at::Tensor& z) {
  const int64_t half = z.size(-1) / 2;
  return at::cat({z.narrow(-1, half, half), -z.narrow(-1, 0, half)}, -1);
}
// [..., d/2] halves → [..., 1, d] in the activations' dtype (broadcast over heads).
at::Tensor full_table(const at::Tensor& half, c10::ScalarType dtype) {
  return at::cat({half, half}, -1).unsqueeze(-2).to(dtype);
}

Normalised head_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                        double eps) {
  const Normalised n = rms_forward(x, weight, eps);
  const at::Tensor c = full_table(cos, x.scalar_type()), s = full_table(sin, x.scalar_type());
  return {n.out * c + rotate_half(n.out) * s, n.rstd};
}

kernel_ops::NormBackward head_backward(const at::Tensor& dout, const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& rstd, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor c = full_table(cos, x.scalar_type()), s = full_table(sin, x.scalar_type());
  const at::Tensor dn = dout * c + rotate_half_transposed(dout * s);  // the norm's output gradient, in x's dtype
  return rms_backward(dn, x, weight, rstd);
}

at::Tensor swiglu_forward(const at::Tensor& gate_up) {
  const int64_t width = gate_up.size(-1) / 2;
  return at::silu(gate_up.narrow(-1, 0, width)) * gate_up.narrow(-1, width, width);
}

// The gradients of gate and of up, each its own contiguous [rows, width].
struct GateUpGrads {
  at::Tensor gate, up;
};
// Written statement by statement, in place where the operands allow: a C++
// full-expression keeps every temporary until it ends, so the one-line form
// d·up·σ·(1 + gate·(1 − σ)) held six [rows, width] temporaries at once (nine
// with d, σ and d_up: the CPU step's peak at block size 16). Each product
// keeps the one-line form's order, so the numbers are the same.
GateUpGrads swiglu_backward(const at::Tensor& gate_up, const at::Tensor& d_out) {
  const int64_t width = gate_up.size(-1) / 2;
  const at::ScalarType f = statistics_type(gate_up);
  const at::Tensor gate = gate_up.narrow(-1, 0, width).to(f), up = gate_up.narrow(-1, width, width).to(f);
  const at::Tensor d = d_out.to(f), sigmoid = at::sigmoid(gate);
  at::Tensor d_up = (gate * sigmoid).to(gate_up.scalar_type()).to(f);  // silu(gate), rounded as the forward rounds it
  d_up.mul_(d);  // a fresh tensor either way: .to returns the product itself when the types agree
  at::Tensor d_gate = d * up;
  d_gate.mul_(sigmoid);
  at::Tensor slope = 1 - sigmoid;  // 1 + gate·(1 − σ)
  slope.mul_(gate).add_(1);
  d_gate.mul_(slope);
  return {d_gate.to(gate_up.scalar_type()), d_up.to(gate_up.scalar_type())};
}

// ---- Dispatch: kernels or closed forms ----------------------------------------

Normalised norm_forward(const at::Tensor& x2d, const at::Tensor& weight, double eps, bool kernels) {
  if (!kernels) return rms_forward(x2d, weight, eps);
  kernel_ops::NormForward r = kernel_ops::rms_norm_with_rstd(x2d, weight, eps);
  return {r.out, r.rstd};
}
kernel_ops::NormBackward norm_backward(const at::Tensor& dy, const at::Tensor& x2d, const at::Tensor& weight,
                                       const at::Tensor& rstd, bool kernels) {
  return kernels ? kernel_ops::rms_norm_backward(dy, x2d, weight, rstd) : rms_backward(dy, x2d, weight, rstd);
}
at::Tensor swiglu_of(const at::Tensor& gate_up, bool kernels) {
  return kernels ? kernel_ops::swiglu(gate_up) : swiglu_forward(gate_up);
}

// ---- The autograd functions -----------------------------------------------------

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps,
                               bool kernels) {
    const at::Tensor rows = x.reshape({-1, x.size(-1)});
    const Normalised n = norm_forward(rows, weight, eps, kernels);
    ctx->save_for_backward({rows, weight, n.rstd});
    ctx->saved_data["kernels"] = kernels;
    return {n.out.view(x.sizes())};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& rows = saved[0];
    const kernel_ops::NormBackward g =
        norm_backward(grad[0].reshape(rows.sizes()), rows, saved[1], saved[2], ctx->saved_data["kernels"].toBool());
    return {g.dx.view(grad[0].sizes()), g.dweight, at::Tensor(), at::Tensor()};
  }
};

class HeadNormRopeFunction : public torch::autograd::Function<HeadNormRopeFunction> {
 public:
  // x [tokens, heads, d]; cos/sin [tokens, d/2].
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                               const at::Tensor& sin, double eps, bool kernels) {
    Normalised n;
    if (kernels) {
      kernel_ops::NormForward r = kernel_ops::head_norm_rope(x, weight, cos, sin, eps);
      n = {r.out, r.rstd};
    } else {
      n = head_forward(x, weight, cos, sin, eps);
    }
    ctx->save_for_backward({x, weight, n.rstd, cos, sin});
    ctx->saved_data["kernels"] = kernels;
    return {n.out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const kernel_ops::NormBackward g = ctx->saved_data["kernels"].toBool()
                                           ? kernel_ops::head_norm_rope_backward(grad[0], s[0], s[1], s[2], s[3], s[4])
                                           : head_backward(grad[0], s[0], s[1], s[2], s[3], s[4]);
    return {g.dx, g.dweight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The norm of x [rows, H] again from its saved rsqrt.
at::Tensor renormalised(const at::Tensor& rows, const at::Tensor& weight, const at::Tensor& rstd, double eps, bool kernels) {
  return kernels ? kernel_ops::rms_norm(rows, weight, eps) : weight * normalised(rows, rstd).to(rows.scalar_type());
}

class NormProjectionsFunction : public torch::autograd::Function<NormProjectionsFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& w1,
                               const at::Tensor& w2, const at::Tensor& w3, double eps, bool kernels) {
    const at::Tensor rows = x.reshape({-1, x.size(-1)});
    const Normalised h = norm_forward(rows, norm_weight, eps, kernels);
    ctx->save_for_backward({rows, norm_weight, h.rstd, w1, w2, w3});
    ctx->saved_data["kernels"] = kernels;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    auto shaped = [&](const at::Tensor& out) {
      std::vector<int64_t> sizes = x.sizes().vec();
      sizes.back() = out.size(-1);
      return out.view(sizes);
    };
    return {shaped(at::mm(h.out, w1.t())), shaped(at::mm(h.out, w2.t())), shaped(at::mm(h.out, w3.t()))};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &rows = s[0], &norm_weight = s[1], &rstd = s[2];
    const bool kernels = ctx->saved_data["kernels"].toBool();
    const at::Tensor h = renormalised(rows, norm_weight, rstd, ctx->saved_data["eps"].toDouble(), kernels);
    at::Tensor dh;
    variable_list weight_grads;
    for (size_t i = 0; i < 3; ++i) {
      const at::Tensor& w = s[3 + i];
      if (!grad[i].defined()) {  // that output was not used
        weight_grads.emplace_back(at::zeros_like(w));
        continue;
      }
      const at::Tensor g = grad[i].reshape({rows.size(0), w.size(0)}).to(rows.scalar_type());
      weight_grads.push_back(at::mm(g.t(), h));
      dh = dh.defined() ? dh.addmm_(g, w) : at::mm(g, w);
    }
    if (!dh.defined()) dh = at::zeros_like(rows);
    const kernel_ops::NormBackward n = norm_backward(dh, rows, norm_weight, rstd, kernels);
    return {n.dx.view(ctx->saved_data["x_sizes"].toIntVector()), n.dweight, weight_grads[0], weight_grads[1],
            weight_grads[2], at::Tensor(), at::Tensor()};
  }
};

// m [rows, H] → [m·gateᵀ | m·upᵀ] in one [rows, 2·I] buffer (two GEMMs
// writing its halves in place: no concatenated weight, no copy).
at::Tensor gate_up_of(const at::Tensor& m, const at::Tensor& gate, const at::Tensor& up) {
  const int64_t width = gate.size(0);
  at::Tensor gate_up = at::empty({m.size(0), 2 * width}, m.options());
  at::Tensor gate_half = gate_up.narrow(1, 0, width), up_half = gate_up.narrow(1, width, width);
  at::mm_out(gate_half, m, gate.t());
  at::mm_out(up_half, m, up.t());
  return gate_up;
}

class MlpBlockFunction : public torch::autograd::Function<MlpBlockFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& norm_weight,
                               const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down, double eps,
                               bool kernels) {
    const at::Tensor rows = y.reshape({-1, y.size(-1)});
    const Normalised m = norm_forward(rows, norm_weight, eps, kernels);
    const at::Tensor gate_up = gate_up_of(m.out, gate, up);
    const at::Tensor out = at::addmm(rows, swiglu_of(gate_up, kernels), down.t());
    ctx->save_for_backward({rows, norm_weight, m.rstd, gate_up, gate, up, down});
    ctx->saved_data["kernels"] = kernels;
    ctx->saved_data["eps"] = eps;
    return {out.view(y.sizes())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &rows = s[0], &norm_weight = s[1], &rstd = s[2], &gate_up = s[3], &gate = s[4], &up = s[5],
                     &down = s[6];
    const bool kernels = ctx->saved_data["kernels"].toBool();
    const int64_t width = gate.size(0);
    const at::Tensor d = grad[0].reshape(rows.sizes()).to(rows.scalar_type());
    at::Tensor d_down;
    {
      // The product silu(gate) ⊙ up again, only for the down projection's weight gradient.
      const at::Tensor product = swiglu_of(gate_up, kernels);
      d_down = at::mm(d.t(), product);
    }
    GateUpGrads d_gate_up;
    {
      const at::Tensor d_product = at::mm(d, down);
      if (kernels) {  // one [rows, 2·I] buffer; cuBLAS reads its halves in place
        const at::Tensor both = kernel_ops::swiglu_backward(gate_up, d_product);
        d_gate_up = {both.narrow(1, 0, width), both.narrow(1, width, width)};
      } else {
        d_gate_up = swiglu_backward(gate_up, d_product);
      }
    }
    // m again, from the saved statistics.
    const at::Tensor m = renormalised(rows, norm_weight, rstd, ctx->saved_data["eps"].toDouble(), kernels);
    const at::Tensor d_gate = at::mm(d_gate_up.gate.t(), m), d_up = at::mm(d_gate_up.up.t(), m);
    at::Tensor dm = at::mm(d_gate_up.gate, gate);
    dm.addmm_(d_gate_up.up, up);
    const kernel_ops::NormBackward n = norm_backward(dm, rows, norm_weight, rstd, kernels);
    return {(d + n.dx).view(grad[0].sizes()), n.dweight, d_gate, d_up, d_down, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

c10::ScalarType rotary_dtype(c10::ScalarType activations) {
  return activations == at::kDouble ? at::kDouble : at::kFloat;
}

RotaryHalves rotary_halves(const at::Tensor& positions, int64_t head_dim, double theta, c10::Device device,
                           c10::ScalarType dtype) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  const at::Tensor inv = 1.0 / at::pow(theta, at::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim));
  const at::Tensor angles = positions.to(device, at::kDouble).unsqueeze(-1) * inv;  // [..., d/2]
  return {angles.cos().to(dtype).contiguous(), angles.sin().to(dtype).contiguous()};
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, Path path) {
  return RmsNormFunction::apply(x, weight, eps, kernels_for(x, path))[0];
}

at::Tensor head_norm_rope(const at::Tensor& x, const at::Tensor& weight, const RotaryHalves& rotary, double eps, Path path) {
  const int64_t heads = x.size(-2), head_dim = x.size(-1), tokens = x.numel() / (heads * head_dim);
  const at::Tensor cos = rotary.cos.reshape({tokens, head_dim / 2}), sin = rotary.sin.reshape({tokens, head_dim / 2});
  const bool kernels = kernels_for(x, path) && cos.scalar_type() == at::kFloat;
  return HeadNormRopeFunction::apply(x.reshape({tokens, heads, head_dim}), weight, cos, sin, eps, kernels)[0].view(x.sizes());
}

Projections norm_projections(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& w1, const at::Tensor& w2,
                             const at::Tensor& w3, double eps, Path path) {
  const variable_list out = NormProjectionsFunction::apply(x, norm_weight, w1, w2, w3, eps, kernels_for(x, path));
  return {out[0], out[1], out[2]};
}

at::Tensor mlp_block(const at::Tensor& y, const at::Tensor& norm_weight, const at::Tensor& gate, const at::Tensor& up,
                     const at::Tensor& down, double eps, Path path) {
  return MlpBlockFunction::apply(y, norm_weight, gate, up, down, eps, kernels_for(y, path))[0];
}

}  // namespace dflash::trainable_ops
