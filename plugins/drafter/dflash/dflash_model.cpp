#include "dflash_model.h"

#include <dflash/sdk/torch_compat.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <limits>

namespace dflash::drafter {
namespace {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // Hugging Face's arithmetic: normalise in fp32, round, then scale.
  const at::Tensor f = x.to(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  return weight * (f * at::rsqrt(f.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x [B, L, heads, d] rotated by positions [B, L].
at::Tensor rope(const at::Tensor& x, const at::Tensor& positions, double theta) {
  const int64_t d = x.size(-1);
  const at::Tensor inv = 1.0 / at::pow(theta, at::arange(0, d, 2, x.options().dtype(at::kDouble)) / static_cast<double>(d));
  const at::Tensor angles = positions.to(x.device(), at::kDouble).unsqueeze(-1) * inv;  // [B, L, d/2]
  const at::Tensor emb = at::cat({angles, angles}, -1).unsqueeze(2);                     // [B, L, 1, d]
  return x * emb.cos().to(x.scalar_type()) + rotate_half(x) * emb.sin().to(x.scalar_type());
}

}  // namespace

at::Tensor& DFlashModel::add(const std::string& name, at::Tensor value) {
  parameters_.emplace_back(name, std::move(value));
  return parameters_.back().second;
}

DFlashModel::DFlashModel(const DrafterShape& s, uint64_t seed, double init_std, c10::ScalarType dtype, c10::Device device)
    : shape_(s) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  auto normal = [&](std::vector<int64_t> size) {
    at::Tensor t = at::empty(size, at::kFloat);
    t.normal_(0.0, init_std, generator);
    return t.to(device, dtype).set_requires_grad(true);
  };
  auto ones = [&](int64_t n) { return at::ones({n}, at::TensorOptions().dtype(dtype).device(device)).set_requires_grad(true); };
  const int64_t h = s.hidden, q_out = s.heads * s.head_dim, kv_out = s.kv_heads * s.head_dim;
  parameters_.reserve(static_cast<size_t>(3 + 11 * s.layers));
  fc_ = add("fc.weight", normal({h, s.feature_layers * s.target_hidden}));
  hidden_norm_ = add("hidden_norm.weight", ones(h));
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    Layer l;
    l.input_norm = add(p + "input_layernorm.weight", ones(h));
    l.q = add(p + "self_attn.q_proj.weight", normal({q_out, h}));
    l.k = add(p + "self_attn.k_proj.weight", normal({kv_out, h}));
    l.v = add(p + "self_attn.v_proj.weight", normal({kv_out, h}));
    l.o = add(p + "self_attn.o_proj.weight", normal({h, q_out}));
    l.q_norm = add(p + "self_attn.q_norm.weight", ones(s.head_dim));
    l.k_norm = add(p + "self_attn.k_norm.weight", ones(s.head_dim));
    l.post_norm = add(p + "post_attention_layernorm.weight", ones(h));
    l.gate = add(p + "mlp.gate_proj.weight", normal({s.intermediate, h}));
    l.up = add(p + "mlp.up_proj.weight", normal({s.intermediate, h}));
    l.down = add(p + "mlp.down_proj.weight", normal({h, s.intermediate}));
    layers_.push_back(l);
  }
  final_norm_ = add("norm.weight", ones(h));
}

void DFlashModel::init_final_norm(const at::Tensor& target_final_norm) {
  const c10::NoGradGuard no_grad;
  final_norm_.copy_(target_final_norm.to(final_norm_.device(), final_norm_.scalar_type()));
}

at::Tensor DFlashModel::forward(const at::Tensor& features, const at::Tensor& context_positions,
                                const at::Tensor& slot_embeddings, const at::Tensor& slot_positions,
                                const at::Tensor& mask) const {
  const DrafterShape& s = shape_;
  const int64_t b = slot_embeddings.size(0), q_len = slot_embeddings.size(1), ctx_len = features.size(1);
  const double eps = s.rms_norm_eps;
  // The context, once: fc + RMSNorm over the concatenated target features.
  const at::Tensor context = rms_norm(at::linear(features.to(fc_.scalar_type()), fc_), hidden_norm_, eps);  // [B, S, H]
  const at::Tensor key_positions = at::cat({context_positions, slot_positions}, 1);
  // Additive (0 / −inf): accepted by both LibTorch versions' attention.
  const at::Tensor bias = at::zeros(mask.sizes(), slot_embeddings.options())
                              .masked_fill_(mask.logical_not().to(slot_embeddings.device()), -std::numeric_limits<float>::infinity())
                              .unsqueeze(1);  // [B, 1, Q, S + Q]
  at::Tensor x = slot_embeddings;
  for (const Layer& l : layers_) {
    const at::Tensor h = rms_norm(x, l.input_norm, eps);
    at::Tensor q = rms_norm(at::linear(h, l.q).view({b, q_len, s.heads, s.head_dim}), l.q_norm, eps);
    // Keys and values: the context's (injected) and the block slots' own, through the same projections.
    at::Tensor k = at::cat({at::linear(context, l.k), at::linear(h, l.k)}, 1).view({b, ctx_len + q_len, s.kv_heads, s.head_dim});
    at::Tensor v = at::cat({at::linear(context, l.v), at::linear(h, l.v)}, 1).view({b, ctx_len + q_len, s.kv_heads, s.head_dim});
    k = rms_norm(k, l.k_norm, eps);
    q = rope(q, slot_positions, s.rope_theta).transpose(1, 2);  // [B, heads, Q, d]
    k = rope(k, key_positions, s.rope_theta).transpose(1, 2);   // [B, kv, S + Q, d]
    v = v.transpose(1, 2);
    if (s.heads > s.kv_heads) {
      k = k.repeat_interleave(s.heads / s.kv_heads, 1);
      v = v.repeat_interleave(s.heads / s.kv_heads, 1);
    }
    const at::Tensor attention = compat::scaled_dot_product_attention(q, k, v, bias, /*is_causal=*/false)
                                     .transpose(1, 2)
                                     .reshape({b, q_len, s.heads * s.head_dim});
    x = x + at::linear(attention, l.o);
    const at::Tensor m = rms_norm(x, l.post_norm, eps);
    x = x + at::linear(at::silu(at::linear(m, l.gate)) * at::linear(m, l.up), l.down);
  }
  return rms_norm(x, final_norm_, eps);
}

}  // namespace dflash::drafter
