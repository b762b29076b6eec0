#include "dflash_model.h"

#include <dflash/sdk/torch_compat.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>
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

namespace {

struct LayerSettings {
  int64_t heads, kv_heads, head_dim;
  double eps, theta;
};

// One decoder layer: x [B, Q, H] (the block slots), context [B, S, H] (the
// injected features), bias [B, 1, Q, S + Q]; w = the layer's 11 weights in
// the order of DFlashModel::Layer.
// How a layer's queries see its keys: a dense additive bias [B, 1, Q, S + Q]
// (any device), or a variable-length plan for flash attention (no masked pair
// computed; CUDA).
struct Attention {
  at::Tensor bias;                       // dense
  at::Tensor gather, cu_queries, cu_keys;  // varlen
  int64_t block_size = 0, max_keys = -1;  // max_keys ≥ 0: varlen
  bool varlen() const { return max_keys >= 0; }
  // Autograd functions need every tensor argument defined: the unused form's
  // tensors become empty ones.
  void fill_unused(const at::TensorOptions& options) {
    for (at::Tensor* t : {&bias, &gather, &cu_queries, &cu_keys})
      if (!t->defined()) *t = at::empty({0}, options);
  }
};

at::Tensor layer_forward(const LayerSettings& s, const std::vector<at::Tensor>& w, const at::Tensor& x,
                         const at::Tensor& context, const Attention& plan, const at::Tensor& slot_positions,
                         const at::Tensor& key_positions) {
  const at::Tensor &input_norm = w[0], &wq = w[1], &wk = w[2], &wv = w[3], &wo = w[4], &q_norm = w[5], &k_norm = w[6];
  const at::Tensor &post_norm = w[7], &gate = w[8], &up = w[9], &down = w[10];
  const int64_t b = x.size(0), q_len = x.size(1), ctx_len = context.size(1);
  const at::Tensor h = rms_norm(x, input_norm, s.eps);
  at::Tensor q = rms_norm(at::linear(h, wq).view({b, q_len, s.heads, s.head_dim}), q_norm, s.eps);
  // Keys and values: the context's (injected) and the block slots' own, through the same projections.
  at::Tensor k = at::cat({at::linear(context, wk), at::linear(h, wk)}, 1).view({b, ctx_len + q_len, s.kv_heads, s.head_dim});
  at::Tensor v = at::cat({at::linear(context, wv), at::linear(h, wv)}, 1).view({b, ctx_len + q_len, s.kv_heads, s.head_dim});
  k = rms_norm(k, k_norm, s.eps);
  q = rope(q, slot_positions, s.theta);  // [B, Q, heads, d]
  k = rope(k, key_positions, s.theta);   // [B, S + Q, kv, d]
  at::Tensor attention;
  if (plan.varlen()) {
    // Keys flattened as [context of every row | block slots of every row],
    // then gathered per block: each block sees exactly its allowed keys.
    auto flat = [&](const at::Tensor& t) {
      return at::cat({t.narrow(1, 0, ctx_len).reshape({b * ctx_len, s.kv_heads, s.head_dim}),
                      t.narrow(1, ctx_len, q_len).reshape({b * q_len, s.kv_heads, s.head_dim})})
          .index_select(0, plan.gather);
    };
    attention = compat::varlen_attention(q.reshape({b * q_len, s.heads, s.head_dim}), flat(k), flat(v), plan.cu_queries,
                                         plan.cu_keys, plan.block_size, plan.max_keys)
                    .reshape({b, q_len, s.heads * s.head_dim});
  } else {
    q = q.transpose(1, 2);  // [B, heads, Q, d]
    k = k.transpose(1, 2);  // [B, kv, S + Q, d]
    v = v.transpose(1, 2);
    if (s.heads > s.kv_heads) {
      k = k.repeat_interleave(s.heads / s.kv_heads, 1);
      v = v.repeat_interleave(s.heads / s.kv_heads, 1);
    }
    attention = compat::scaled_dot_product_attention(q, k, v, plan.bias, /*is_causal=*/false)
                    .transpose(1, 2)
                    .reshape({b, q_len, s.heads * s.head_dim});
  }
  const at::Tensor y = x + at::linear(attention, wo);
  const at::Tensor m = rms_norm(y, post_norm, s.eps);
  return y + at::linear(at::silu(at::linear(m, gate)) * at::linear(m, up), down);
}

// A layer whose activations are not kept: forward saves only its inputs, and
// backward runs the layer again with grad to get the gradients. Costs one more
// forward of the layer; keeps one layer's activations alive instead of all.
class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x, at::Tensor context,
                                                at::Tensor bias, at::Tensor gather, at::Tensor cu_queries, at::Tensor cu_keys,
                                                int64_t block_size, int64_t max_keys, at::Tensor slot_positions, at::Tensor key_positions,
                                                at::Tensor w0, at::Tensor w1, at::Tensor w2, at::Tensor w3, at::Tensor w4,
                                                at::Tensor w5, at::Tensor w6, at::Tensor w7, at::Tensor w8, at::Tensor w9,
                                                at::Tensor w10, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
                                                double theta) {
    ctx->save_for_backward({x, context, bias, slot_positions, key_positions, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10,
                            gather, cu_queries, cu_keys});
    ctx->saved_data["block_size"] = block_size;
    ctx->saved_data["max_keys"] = max_keys;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["head_dim"] = head_dim;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["theta"] = theta;
    const LayerSettings s{heads, kv_heads, head_dim, eps, theta};
    const Attention plan{bias, gather, cu_queries, cu_keys, block_size, max_keys};
    return {layer_forward(s, {w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10}, x, context, plan, slot_positions, key_positions)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    const LayerSettings s{ctx->saved_data["heads"].toInt(), ctx->saved_data["kv_heads"].toInt(),
                          ctx->saved_data["head_dim"].toInt(), ctx->saved_data["eps"].toDouble(),
                          ctx->saved_data["theta"].toDouble()};
    const c10::AutoGradMode enable(true);
    // Fresh leaves for every differentiable input; the gradients returned
    // here are what autograd accumulates into the real ones.
    std::vector<at::Tensor> leaves, weights;
    auto leaf = [&](const at::Tensor& t) {
      at::Tensor l = t.detach().requires_grad_(t.is_floating_point());
      leaves.push_back(l);
      return l;
    };
    const at::Tensor x = leaf(saved[0]), context = leaf(saved[1]);
    for (size_t i = 5; i < 16; ++i) weights.push_back(leaf(saved[i]));
    const Attention plan{saved[2], saved[16], saved[17], saved[18], ctx->saved_data["block_size"].toInt(),
                         ctx->saved_data["max_keys"].toInt()};
    const at::Tensor y = layer_forward(s, weights, x, context, plan, saved[3], saved[4]);
    const auto grads = torch::autograd::grad({y}, leaves, {grad_output[0]}, /*retain_graph=*/false,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    // x, context; bias, gather, cu_queries, cu_keys, block_size, max_keys, slot and key positions: none.
    torch::autograd::variable_list out = {grads[0], grads[1]};
    for (int i = 0; i < 8; ++i) out.emplace_back();
    for (size_t i = 2; i < grads.size(); ++i) out.push_back(grads[i]);
    for (int i = 0; i < 5; ++i) out.emplace_back();  // heads, kv_heads, head_dim, eps, theta
    return out;
  }
};

}  // namespace

bool DFlashModel::uses_varlen_attention(const at::Tensor& like) const {
  return varlen_attention_ && compat::varlen_attention_available(like) && shape_.head_dim <= 256;
}

at::Tensor DFlashModel::forward(const at::Tensor& features, const at::Tensor& context_positions,
                                const at::Tensor& slot_embeddings, const at::Tensor& slot_positions,
                                const BlockMasks& masks) const {
  const DrafterShape& s = shape_;
  const double eps = s.rms_norm_eps;
  // The context, once: fc + RMSNorm over the concatenated target features.
  const at::Tensor context = rms_norm(at::linear(features.to(fc_.scalar_type()), fc_), hidden_norm_, eps);  // [B, S, H]
  const at::Tensor key_positions = at::cat({context_positions, slot_positions}, 1);
  Attention plan;
  if (uses_varlen_attention(slot_embeddings)) {
    const auto device = slot_embeddings.device();
    plan.gather = masks.varlen.gather.to(device);
    plan.cu_queries = masks.varlen.cu_queries.to(device);
    plan.cu_keys = masks.varlen.cu_keys.to(device);
    plan.block_size = masks.block_size;
    plan.max_keys = masks.varlen.max_keys;
  } else {
    // Additive (0 / −inf): accepted by both LibTorch versions' attention.
    plan.bias = at::zeros(masks.dense.sizes(), slot_embeddings.options())
                    .masked_fill_(masks.dense.logical_not().to(slot_embeddings.device()), -std::numeric_limits<float>::infinity())
                    .unsqueeze(1);  // [B, 1, Q, S + Q]
  }
  plan.fill_unused(slot_embeddings.options());
  const LayerSettings settings{s.heads, s.kv_heads, s.head_dim, eps, s.rope_theta};
  at::Tensor x = slot_embeddings;
  for (const Layer& l : layers_) {
    if (activation_checkpointing_ && c10::GradMode::is_enabled()) {
      x = CheckpointedLayer::apply(x, context, plan.bias, plan.gather, plan.cu_queries, plan.cu_keys, plan.block_size,
                                   plan.max_keys, slot_positions, key_positions, l.input_norm, l.q, l.k, l.v, l.o,
                                   l.q_norm, l.k_norm, l.post_norm, l.gate, l.up, l.down, s.heads, s.kv_heads, s.head_dim,
                                   eps, s.rope_theta)[0];
    } else {
      x = layer_forward(settings, {l.input_norm, l.q, l.k, l.v, l.o, l.q_norm, l.k_norm, l.post_norm, l.gate, l.up, l.down},
                        x, context, plan, slot_positions, key_positions);
    }
  }
  return rms_norm(x, final_norm_, eps);
}

}  // namespace dflash::drafter
