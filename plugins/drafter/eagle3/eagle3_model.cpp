#include "eagle3_model.h"

#include "ttt_attention.h"
#include "ttt_flash_attention.h"

#include "trainable_ops.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace dflash::eagle3 {

namespace {

// transformers' LlamaRMSNorm: normalise in fp32, round to x's dtype, scale.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor f = x.to(at::kFloat);
  return weight * (f * at::rsqrt(f.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}

// Llama's rotary embedding over the whole head: x [B, heads, S, d] at
// positions [B, S]; the angles in fp32 as transformers forms them.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& positions, double theta) {
  const int64_t d = x.size(-1);
  const at::Tensor inv_freq =
      at::pow(theta, at::arange(0, d, 2, x.options().dtype(at::kFloat)) / static_cast<double>(d)).reciprocal();
  const at::Tensor freqs = positions.to(x.device(), at::kFloat).unsqueeze(-1) * inv_freq;  // [B, S, d/2]
  const at::Tensor angles = at::cat({freqs, freqs}, -1).unsqueeze(1);                      // [B, 1, S, d]
  const at::Tensor cos = angles.cos().to(x.scalar_type()), sin = angles.sin().to(x.scalar_type());
  const at::Tensor rotated = at::cat({-x.narrow(-1, d / 2, d / 2), x.narrow(-1, 0, d / 2)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor normal(const std::vector<int64_t>& sizes, const c10::TensorOptions& options, at::Generator& generator) {
  at::Tensor t = at::empty(sizes, options.dtype(at::kFloat).device(at::kCPU));
  t.normal_(0.0, 0.02, generator);
  return t.to(options).requires_grad_(true);
}

}  // namespace

Eagle3Model::Eagle3Model(const Eagle3Shape& s, const c10::TensorOptions& options, uint64_t seed) : shape_(s) {
  if (s.hidden < 1 || s.target_hidden < 1 || s.heads < 1 || s.kv_heads < 1 || s.heads % s.kv_heads != 0 || s.head_dim < 2 ||
      s.head_dim % 2 != 0 || s.intermediate < 1 || s.draft_vocab < 1 || s.feature_layers < 1)
    throw std::invalid_argument("eagle3: an impossible shape (heads a multiple of kv_heads, an even head_dim, all sizes >= 1)");
  at::Generator generator = at::detail::createCPUGenerator(seed);
  const int64_t h = s.hidden, q_width = s.heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  auto ones = [&](int64_t n) { return at::ones({n}, options).requires_grad_(true); };
  fc_ = normal({h, s.feature_layers * s.target_hidden}, options, generator);
  hidden_norm_ = ones(h);
  input_norm_ = ones(h);
  q_ = normal({q_width, 2 * h}, options, generator);
  k_ = normal({kv_width, 2 * h}, options, generator);
  v_ = normal({kv_width, 2 * h}, options, generator);
  o_ = normal({h, q_width}, options, generator);
  post_norm_ = ones(h);
  gate_ = normal({s.intermediate, h}, options, generator);
  up_ = normal({s.intermediate, h}, options, generator);
  down_ = normal({h, s.intermediate}, options, generator);
  norm_ = ones(h);
  lm_head_ = normal({s.draft_vocab, h}, options, generator);
}

std::vector<std::pair<std::string, at::Tensor>> Eagle3Model::parameters() const {
  return {{"fc.weight", fc_},
          {"midlayer.hidden_norm.weight", hidden_norm_},
          {"midlayer.input_layernorm.weight", input_norm_},
          {"midlayer.self_attn.q_proj.weight", q_},
          {"midlayer.self_attn.k_proj.weight", k_},
          {"midlayer.self_attn.v_proj.weight", v_},
          {"midlayer.self_attn.o_proj.weight", o_},
          {"midlayer.post_attention_layernorm.weight", post_norm_},
          {"midlayer.mlp.gate_proj.weight", gate_},
          {"midlayer.mlp.up_proj.weight", up_},
          {"midlayer.mlp.down_proj.weight", down_},
          {"norm.weight", norm_},
          {"lm_head.weight", lm_head_}};
}

at::Tensor Eagle3Model::norm(const at::Tensor& x, const at::Tensor& weight) const {
  return shape_.fused_ops ? trainable_ops::rms_norm(x, weight, shape_.rms_norm_eps) : rms_norm(x, weight, shape_.rms_norm_eps);
}

at::Tensor Eagle3Model::layer_input(const at::Tensor& embeddings, const at::Tensor& hidden) const {
  return at::cat({norm(embeddings, input_norm_), norm(hidden, hidden_norm_)}, -1);
}

at::Tensor Eagle3Model::layer_output(const at::Tensor& hidden, const at::Tensor& attention) const {
  const at::Tensor out = hidden + at::linear(attention, o_);
  if (shape_.fused_ops) return trainable_ops::mlp_block(out, post_norm_, gate_, up_, down_, shape_.rms_norm_eps);
  const at::Tensor m = rms_norm(out, post_norm_, shape_.rms_norm_eps);
  return out + at::linear(at::silu(at::linear(m, gate_)) * at::linear(m, up_), down_);
}

at::Tensor Eagle3Model::final_norm(const at::Tensor& hidden) const { return norm(hidden, norm_); }

at::Tensor Eagle3Model::project(const at::Tensor& features) const { return at::linear(features, fc_); }

at::Tensor Eagle3Model::draft_logits(const at::Tensor& hidden) const { return at::linear(final_norm(hidden), lm_head_); }

Eagle3Model::Pass Eagle3Model::extend(const at::Tensor& embeddings, const at::Tensor& hidden, const at::Tensor& positions,
                                      const at::Tensor& keys, const at::Tensor& values) const {
  const Eagle3Shape& s = shape_;
  const int64_t n = hidden.size(0), d = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t cached = keys.defined() ? keys.size(1) : 0;
  const at::Tensor read = layer_input(embeddings, hidden);
  // [1, heads, n, d], as forward_ttt lays them out (one row).
  auto heads_first = [&](const at::Tensor& x, int64_t heads) { return x.view({1, n, heads, d}).transpose(1, 2); };
  const at::Tensor rows = positions.view({1, n});
  const at::Tensor q = rotate(heads_first(at::linear(read, q_), s.heads), rows, s.rope_theta);
  Pass pass;
  pass.keys = rotate(heads_first(at::linear(read, k_), s.kv_heads), rows, s.rope_theta).squeeze(0);  // [kv, n, d]
  pass.values = heads_first(at::linear(read, v_), s.kv_heads).squeeze(0);
  const at::Tensor all_keys = cached > 0 ? at::cat({keys, pass.keys}, 1) : pass.keys;
  const at::Tensor all_values = cached > 0 ? at::cat({values, pass.values}, 1) : pass.values;
  // New position t sees keys [0, cached + t].
  const at::Tensor visible = at::arange(cached + n, positions.options().dtype(at::kLong).device(hidden.device()))
                                 .view({1, -1})
                                 .le((at::arange(n, positions.options().dtype(at::kLong).device(hidden.device())) + cached).view({-1, 1}));
  const at::Tensor bias = at::zeros(visible.sizes(), hidden.options().dtype(at::kFloat))
                              .masked_fill_(visible.logical_not(), -std::numeric_limits<float>::infinity());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const at::Tensor k_all = all_keys.repeat_interleave(group, 0), v_all = all_values.repeat_interleave(group, 0);
  const at::Tensor scores = (at::matmul(q.squeeze(0), k_all.transpose(1, 2)) * scale).to(at::kFloat) + bias;  // [heads, n, m]
  const at::Tensor attention = at::matmul(at::softmax(scores, -1).to(q.scalar_type()), v_all);                  // [heads, n, d]
  pass.out = layer_output(hidden, attention.transpose(0, 1).reshape({n, s.heads * d}));
  return pass;
}

at::Tensor Eagle3Model::forward_ttt(const at::Tensor& features, const at::Tensor& embeddings, const TttLayout& layout,
                                    const at::Tensor& documents) const {
  const Eagle3Shape& s = shape_;
  const int64_t b = features.size(0), length = features.size(1), d = s.head_dim;
  if (features.dim() != 3 || features.size(2) != s.feature_layers * s.target_hidden)
    throw std::invalid_argument("eagle3: features must be [B, S, " + std::to_string(s.feature_layers * s.target_hidden) + "]");
  if (embeddings.dim() != 4 || embeddings.size(0) != layout.steps || embeddings.size(1) != b || embeddings.size(2) != length)
    throw std::invalid_argument("eagle3: embeddings must be [steps, B, S, H]");
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const at::Tensor docs = documents.to(features.device(), at::kLong);
  auto heads_first = [&](const at::Tensor& x, int64_t heads) { return x.view({b, length, heads, d}).transpose(1, 2); };

  at::Tensor hidden = at::linear(features, fc_);
  // Flash attention where it runs: the documents as varlen sequences, built once for every step.
  const bool flash = s.flash_attention && ttt_flash_attention_available(hidden, d);
  const TttSequences sequences = flash ? ttt_sequences(documents, features.device()) : TttSequences{};
  std::vector<at::Tensor> keys, values, outputs;  // [B, kv_heads, S, d] per step
  for (int64_t k = 0; k < layout.steps; ++k) {
    const at::Tensor positions = layout.positions[k];
    const at::Tensor read = layer_input(embeddings[k], hidden);
    const at::Tensor q = rotate(heads_first(at::linear(read, q_), s.heads), positions, s.rope_theta);
    keys.push_back(rotate(heads_first(at::linear(read, k_), s.kv_heads), positions, s.rope_theta));
    values.push_back(heads_first(at::linear(read, v_), s.kv_heads));
    // Step 0's keys of the document up to the query, then its own position's
    // keys of steps 1 … k, without an [S, S] score matrix (ttt_attention.h).
    const at::TensorList own_keys = at::TensorList(keys).slice(1), own_values = at::TensorList(values).slice(1);
    const at::Tensor attention = flash ? ttt_flash_attention(q, keys[0], values[0], own_keys, own_values, sequences, scale)
                                       : ttt_attention(q, keys[0], values[0], own_keys, own_values, docs, scale);
    hidden = layer_output(hidden, attention.transpose(1, 2).reshape({b, length, s.heads * d}));
    outputs.push_back(hidden);
  }
  return at::stack(outputs);
}

}  // namespace dflash::eagle3
