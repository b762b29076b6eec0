#include "hybrid_model.h"

#include "gated_deltanet.h"

#include <checkpoint.h>
#include <cuda_graph.h>
#include <host_upload.h>
#include <pending_trees.h>
#include <kernel_ops.h>
#include <packed_rows.h>
#include <target_outputs.h>
#include <dflash/sdk/torch_compat.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

namespace dflash::target {
namespace fs = std::filesystem;

namespace {

// Decoding steps of up to this many tokens per session run the delta rule
// token by token and keep the state after every token (so a verified block
// can be cut back anywhere); longer ones (prompts) run the chunked form.
constexpr int64_t kRecurrentMaxTokens = 64;

// transformers' Qwen3_5RMSNorm: x̂ · (1 + w) in fp32, then rounded to x's
// dtype. scale is the fp32 (1 + w).
at::Tensor norm_1p(const at::Tensor& x, const at::Tensor& scale, double eps) {
  if (kernel_ops::runs_on(x)) return kernel_ops::rms_norm_scaled(x, scale, eps);  // the same, in one pass
  const at::Tensor f = x.to(at::kFloat);
  return (f * at::rsqrt(f.pow(2).mean(-1, true) + eps) * scale).to(x.scalar_type());
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Rotary embedding on the first rotary_dim of each head. x [N, heads, hd];
// cos, sin [N, rotary_dim] in x's dtype.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rd = cos.size(-1), hd = x.size(-1);
  const at::Tensor rot = x.narrow(-1, 0, rd);
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  const at::Tensor turned = rot * c + rotate_half(rot) * s;
  return rd == hd ? turned : at::cat({turned, x.narrow(-1, rd, hd - rd)}, -1);
}

// Loads `name` as fp32 (1 + w), the form every (1 + w) RMSNorm uses; w is
// first rounded to the model's dtype, as transformers holds it.
at::Tensor one_plus(const hf::Checkpoint& ckpt, const std::string& name, int64_t width, c10::ScalarType dtype,
                    const c10::Device& device) {
  return ckpt.get(name, {width}, dtype, device).to(at::kFloat) + 1.0;
}

// x [..., in] · wᵀ: cuBLAS, or exact decoding's row-invariant kernel
// (kernel_ops::invariant_linear: a row's result is the same at any row count).
at::Tensor project(const at::Tensor& x, const at::Tensor& w, bool invariant) { return kernel_ops::linear(x, w, {}, invariant); }

struct Projected {  // a full-attention layer's queries, keys, values and output gate
  at::Tensor q, k, v, gate;  // q [N, heads, hd]; k, v [N, kv_heads, hd]; gate [N, heads hd]
};
Projected project_full(const HybridConfig& c, const FullAttentionWeights& w, const at::Tensor& h, const at::Tensor& cos,
                       const at::Tensor& sin, bool invariant = false) {
  const int64_t n = h.size(0), heads = c.num_heads, kv = c.num_kv_heads, hd = c.head_dim;
  const at::Tensor qkv = project(h, w.qkv, invariant);
  const at::Tensor query_gate = qkv.narrow(1, 0, 2 * heads * hd).view({n, heads, 2 * hd});
  Projected p;
  p.gate = query_gate.narrow(2, hd, hd).reshape({n, heads * hd});
  p.q = apply_rotary(norm_1p(query_gate.narrow(2, 0, hd), w.q_norm, c.rms_norm_eps), cos, sin);
  p.k = apply_rotary(norm_1p(qkv.narrow(1, 2 * heads * hd, kv * hd).view({n, kv, hd}), w.k_norm, c.rms_norm_eps), cos,
                     sin);
  p.v = qkv.narrow(1, (2 * heads + kv) * hd, kv * hd).view({n, kv, hd});
  return p;
}

// A decoding step's projections of a full-attention layer (rotary [N, 2, ·]:
// cos, sin), its keys and values written into the layer's pools at `slots`
// (rows of the pools flattened to [rows · capacity, kv_heads, hd]).
Projected project_into_cache(const HybridConfig& c, const FullAttentionWeights& w, const at::Tensor& h,
                             const at::Tensor& rotary, at::Tensor& key_pool, at::Tensor& value_pool, const at::Tensor& slots,
                             bool invariant = false) {
  Projected p = project_full(c, w, h, rotary.select(1, 0), rotary.select(1, 1), invariant);
  key_pool.view({-1, c.num_kv_heads, c.head_dim}).index_copy_(0, slots, p.k);
  value_pool.view({-1, c.num_kv_heads, c.head_dim}).index_copy_(0, slots, p.v);
  return p;
}

// The output gate and o_proj after attention [N, heads hd].
at::Tensor finish_full(const FullAttentionWeights& w, const at::Tensor& attention, const at::Tensor& gate,
                       bool invariant = false) {
  return project(attention * at::sigmoid(gate), w.o, invariant);
}

// SDPA over [B, heads, S, hd] queries with keys and values of kv_heads heads,
// each serving heads / kv_heads consecutive query heads (transformers'
// repeat_kv; compat passes enable_gqa where LibTorch has it).
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& mask,
                  bool causal) {
  return compat::grouped_query_attention(q, k, v, mask, causal);
}

// A Gated DeltaNet layer on normed input h [B, S, H]. window [B, K-1, C]:
// the conv inputs before the rows (undefined: zeros); initial [B, Hv, dk, dv]
// (undefined: zeros). With keep_inputs (decoding), `inputs` receives
// [B, K-1+S, C], the conv window followed by the step's own conv inputs.
struct RuleInputs {  // the delta rule's inputs: q, k [.., Hk, dk], v [.., Hv, dv], g, β [.., Hv]
  at::Tensor q, k, v, g, beta;
};
struct LinearResult {
  at::Tensor out;     // [B, S, H]
  at::Tensor inputs;  // [B, K-1+S, C]
  RuleInputs rule;    // [B, S, ...], with keep_inputs
  gdn::DeltaOutput delta;
};
LinearResult linear_attention(const HybridConfig& c, const LinearAttentionWeights& w, const at::Tensor& h,
                              const at::Tensor& resets, const at::Tensor& window, const at::Tensor& initial,
                              bool recurrent, bool keep_inputs, const kernel_ops::DeltaChunkPlan* plan = nullptr,
                              bool invariant = false) {
  const int64_t b = h.size(0), s = h.size(1), conv_dim = c.conv_dim(), vd = c.value_dim();
  const int64_t hv = c.linear_value_heads, hk = c.linear_key_heads, dk = c.linear_key_dim, dv = c.linear_value_dim;
  const at::Tensor projected = project(h, w.in_proj, invariant);  // [B, S, conv_dim + vd + 2 Hv]
  const at::Tensor qkv = projected.narrow(2, 0, conv_dim);
  const at::Tensor z = projected.narrow(2, conv_dim, vd);
  const at::Tensor beta = at::sigmoid(projected.narrow(2, conv_dim + vd, hv));
  const at::Tensor a = projected.narrow(2, conv_dim + vd + hv, hv);
  // transformers: -exp(A_log) · softplus(a + dt_bias), in fp32.
  const at::Tensor g = -w.a_log.to(at::kFloat).exp() * at::softplus(a.to(at::kFloat) + w.dt_bias, 1, 20);
  LinearResult r;
  const at::Tensor before =
      window.defined() ? window.to(qkv.scalar_type()) : at::zeros({b, c.conv_kernel - 1, conv_dim}, qkv.options());
  if (keep_inputs) r.inputs = at::cat({before, qkv}, 1);
  const at::Tensor mixed = gdn::causal_conv(qkv, w.conv, resets, before);
  const at::Tensor q = mixed.narrow(2, 0, c.key_dim()).view({b, s, hk, dk});
  const at::Tensor k = mixed.narrow(2, c.key_dim(), c.key_dim()).view({b, s, hk, dk});
  const at::Tensor v = mixed.narrow(2, 2 * c.key_dim(), vd).view({b, s, hv, dv});
  r.delta = recurrent ? gdn::recurrent_delta_rule(q, k, v, g, beta, initial)
                      : gdn::chunked_delta_rule(q, k, v, g, beta, resets, initial, kernel_ops::kDeltaRuleChunk, plan);
  if (keep_inputs) r.rule = {q, k, v, g, beta};
  // The gated RMSNorm per value head: w · x̂ rounded to the dtype, times
  // SiLU(z) in fp32, rounded again (transformers' Qwen3_5RMSNormGated).
  at::Tensor gated;
  if (kernel_ops::runs_on(r.delta.out)) {
    gated = kernel_ops::gated_rms_norm(r.delta.out.view({b * s, hv, dv}), z.reshape({b * s, vd}), w.norm, c.rms_norm_eps);
  } else {
    const at::Tensor core = r.delta.out.to(at::kFloat);
    const at::Tensor normed = w.norm * (core * at::rsqrt(core.pow(2).mean(-1, true) + c.rms_norm_eps)).to(h.scalar_type());
    gated = (normed * at::silu(z.view({b, s, hv, dv}).to(at::kFloat))).to(h.scalar_type());
  }
  r.out = project(gated.view({b, s, vd}), w.out, invariant);
  return r;
}

bool has_full_attention(const HybridConfig& c) { return c.count(Mixer::kFullAttention) > 0; }

}  // namespace

// A recurrent step's record, shared by the sessions that took it together
// (row i is sessions[i]'s), every linear layer stacked first: the conv inputs
// [L, count, K-1+n, C] (the window before the step, then the step's own) and
// the delta rule's inputs [L, count, n, ...]. From it and the state before
// the step truncate restores any length inside the step, replaying the rule
// up to the cut for all layers in one call — a few KB a token where keeping
// the states themselves would be Hv·dk·dv·4 bytes (3 MiB at Qwen3.6-27B's
// shape) a token and layer.
struct StepRecord {
  at::Tensor inputs;
  RuleInputs rule;
};

// Stacks the layers' records of one step (each [count, ...]) into one.
std::shared_ptr<const StepRecord> stacked_record(const std::vector<at::Tensor>& inputs, const std::vector<RuleInputs>& rule) {
  auto record = std::make_shared<StepRecord>();
  std::vector<at::Tensor> q, k, v, g, beta;
  for (const RuleInputs& r : rule) {
    q.push_back(r.q);
    k.push_back(r.k);
    v.push_back(r.v);
    g.push_back(r.g);
    beta.push_back(r.beta);
  }
  record->inputs = at::stack(inputs);
  record->rule = {at::stack(q), at::stack(k), at::stack(v), at::stack(g), at::stack(beta)};
  return record;
}

// A pending draft tree's per-node inputs, for each linear layer: the conv
// input [n, C] and the delta rule's inputs [n, 1, ...], in node order.
struct TreeRecord {
  std::vector<at::Tensor> conv_inputs;
  std::vector<RuleInputs> rule;
};

// Per session: its slot in linear_states_ (the conv windows and recurrent
// states, with the ones before the last step) and the last step's extent.
struct HybridModel::SessionStates {
  int64_t slot = 0;
  int64_t step_start = 0, step_tokens = 0;
  bool step_replayable = true;              // a recurrent step (or none yet); a chunked one keeps only its start
  std::shared_ptr<const StepRecord> step;  // the last recurrent step's record (null otherwise)
  int64_t step_row = 0;                     // this session's row in it
  std::shared_ptr<const TreeRecord> tree;   // a verified tree awaiting accept_path (null otherwise)
};

HybridModel::HybridModel(const fs::path& dir, c10::ScalarType dtype, c10::Device device, const HybridOptions& options)
    : config_(read_hybrid_config(dir / "config.json")) {
  const hf::Checkpoint ckpt(dir);
  const HybridConfig& c = config_;
  prefix_ = ckpt.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  // What a text model does not read: a multimodal checkpoint's vision tower,
  // and the multi-token-prediction head some Qwen3.5 folders carry.
  for (const char* other : {"model.visual.", "visual.", "mtp.", "model.mtp."})
    ignored_tensors_ += static_cast<int64_t>(ckpt.names_with_prefix(other).size());
  const int64_t h = c.hidden_size, hd = c.head_dim;
  embed_ = ckpt.get(prefix_ + "embed_tokens.weight", {c.vocab_size, h}, dtype, device);
  final_norm_ = one_plus(ckpt, prefix_ + "norm.weight", h, dtype, device);
  final_norm_scale_ = final_norm_.to(dtype);
  if (ckpt.has("lm_head.weight")) lm_head_ = ckpt.get("lm_head.weight", {c.vocab_size, h}, dtype, device);
  else if (c.tie_word_embeddings) lm_head_ = embed_;
  else
    throw std::runtime_error(dir.string() + ": tensor 'lm_head.weight' is missing and config.json's tie_word_embeddings "
                             "is false");
  int64_t linear_count = 0, full_count = 0;  // each layer's ordinal among its kind
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = prefix_ + "layers." + std::to_string(i) + ".";
    HybridLayerWeights w;
    w.mixer = c.layer_types[static_cast<size_t>(i)];
    w.input_norm = one_plus(ckpt, p + "input_layernorm.weight", h, dtype, device);
    w.post_attention_norm = one_plus(ckpt, p + "post_attention_layernorm.weight", h, dtype, device);
    if (w.mixer == Mixer::kLinearAttention) {
      const std::string a = p + "linear_attn.";
      const int64_t hv = c.linear_value_heads;
      LinearAttentionWeights& l = w.linear;
      l.in_proj = at::cat({ckpt.get(a + "in_proj_qkv.weight", {c.conv_dim(), h}, dtype, device),
                           ckpt.get(a + "in_proj_z.weight", {c.value_dim(), h}, dtype, device),
                           ckpt.get(a + "in_proj_b.weight", {hv, h}, dtype, device),
                           ckpt.get(a + "in_proj_a.weight", {hv, h}, dtype, device)});
      l.conv = ckpt.get(a + "conv1d.weight", {c.conv_dim(), 1, c.conv_kernel}, dtype, device).view({c.conv_dim(), c.conv_kernel});
      l.a_log = ckpt.get(a + "A_log", {hv}, dtype, device);
      l.dt_bias = ckpt.get(a + "dt_bias", {hv}, dtype, device);
      l.norm = ckpt.get(a + "norm.weight", {c.linear_value_dim}, dtype, device);
      l.out = ckpt.get(a + "out_proj.weight", {h, c.value_dim()}, dtype, device);
      linear_index_.push_back(linear_count++);
      full_index_.push_back(-1);
    } else {
      const std::string a = p + "self_attn.";
      FullAttentionWeights& f = w.full;
      f.qkv = at::cat({ckpt.get(a + "q_proj.weight", {2 * c.num_heads * hd, h}, dtype, device),
                       ckpt.get(a + "k_proj.weight", {c.num_kv_heads * hd, h}, dtype, device),
                       ckpt.get(a + "v_proj.weight", {c.num_kv_heads * hd, h}, dtype, device)});
      f.q_norm = one_plus(ckpt, a + "q_norm.weight", hd, dtype, device);
      f.k_norm = one_plus(ckpt, a + "k_norm.weight", hd, dtype, device);
      f.o = ckpt.get(a + "o_proj.weight", {h, c.num_heads * hd}, dtype, device);
      full_index_.push_back(full_count++);
      linear_index_.push_back(-1);
    }
    if (c.is_moe()) {
      w.moe = hf::load_moe(ckpt, p + "mlp.", c.moe, h, dtype, device);
    } else {
      w.gate_up = at::cat({ckpt.get(p + "mlp.gate_proj.weight", {c.intermediate_size, h}, dtype, device),
                           ckpt.get(p + "mlp.up_proj.weight", {c.intermediate_size, h}, dtype, device)});
      w.down = ckpt.get(p + "mlp.down_proj.weight", {h, c.intermediate_size}, dtype, device);
    }
    layers_.push_back(std::move(w));
  }
  // transformers' default rotary frequencies, formed in fp32 as it forms them.
  const int64_t rd = c.rotary_dim;
  inv_freq_ = at::pow(c.rope_theta, at::arange(0, rd, 2, embed_.options().dtype(at::kFloat)) / static_cast<double>(rd))
                  .reciprocal();
  kv_ = hf::DecodeSessions(c.count(Mixer::kFullAttention), c.num_kv_heads, hd, embed_.options());
  linear_states_ = LinearStatePool(c.count(Mixer::kLinearAttention), {c.conv_kernel - 1, c.conv_dim()},
                                   {c.linear_value_heads, c.linear_key_dim, c.linear_value_dim}, embed_.options(),
                                   embed_.options().dtype(at::kFloat));
  decide_exact_decoding(dir, options.exact_decoding);
  if (options.decode_graphs && exact_decoding_ && decode_support::kCudaGraphs) {
    graphs_ = std::make_unique<DecodeGraphs>(device);
    kv_.set_keep_when_empty(true, c.generation.max_position_embeddings);  // graphs read the pool's addresses
  }
}

// Where exact decoding can hold: the kernels take the activations (CUDA
// bf16/fp16), every projection's input width is a multiple of 8 (the hidden
// size, the linear layers' value width, the attention's heads·head_dim, the
// MLP's width), head_dim suits the attention kernel, and no experts (their
// grouped GEMMs have no row-invariant form).
void HybridModel::decide_exact_decoding(const fs::path& dir, decode_support::ExactDecoding setting) {
  const HybridConfig& c = config_;
  if (setting == decode_support::ExactDecoding::kOff) return;
  exact_required_ = setting == decode_support::ExactDecoding::kOn;
  const bool linear = c.count(Mixer::kLinearAttention) > 0, full = has_full_attention(c);
  const bool widths = c.hidden_size % 8 == 0 && (!linear || c.value_dim() % 8 == 0) &&
                      (!full || (c.num_heads * c.head_dim) % 8 == 0) && c.intermediate_size % 8 == 0;
  const bool attention = !full || kernel_ops::invariant_decode_attention_fits(c.head_dim, 1);
  exact_decoding_ = kernel_ops::runs_on(embed_) && !c.is_moe() && widths && attention;
  if (exact_required_ && !exact_decoding_)
    throw std::runtime_error(
        dir.string() + ": exact_decoding: on needs a CUDA device in bf16/fp16, no experts (this model: " +
        (c.is_moe() ? std::to_string(c.moe.experts) + " experts" : std::string("dense")) +
        "), hidden_size, the linear layers' value width, heads·head_dim and intermediate_size in multiples of 8 (" +
        std::to_string(c.hidden_size) + ", " + std::to_string(c.value_dim()) + ", " +
        std::to_string(c.num_heads * c.head_dim) + ", " + std::to_string(c.intermediate_size) +
        ") and head_dim a multiple of 8 up to 256 (" + std::to_string(c.head_dim) +
        "); set exact_decoding: auto or off");
}

bool HybridModel::exact_step(int64_t tokens_in_step, const char* call) const {
  if (!exact_decoding_ || tokens_in_step > kernel_ops::kInvariantMaxRows) return false;
  if (!has_full_attention(config_)) return true;
  const int64_t capacity = kv_.row_capacity();
  const bool fits = kernel_ops::invariant_decode_attention_fits(config_.head_dim, capacity) && kv_.offsets_fit_int32();
  if (!fits && exact_required_) throw std::invalid_argument(decode_support::exact_decoding_capacity_refusal(call, capacity));
  return fits;
}

HybridModel::~HybridModel() = default;

at::Tensor HybridModel::rotary_cos_sin(const at::Tensor& positions) const {
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq_;  // [N, rd/2] fp32
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  return at::stack({angles.cos(), angles.sin()}, 1).to(embed_.scalar_type());  // [N, 2, rd]
}

at::Tensor HybridModel::mlp(const HybridLayerWeights& w, const at::Tensor& x, bool invariant) const {
  if (config_.is_moe()) return hf::moe_forward(w.moe, config_.moe, x);
  const at::Tensor gate_up = project(x, w.gate_up, invariant);
  const int64_t inter = config_.intermediate_size;
  if (kernel_ops::runs_on(gate_up)) {  // the same rounding, in one pass
    std::vector<int64_t> shape = gate_up.sizes().vec();
    shape.back() = inter;
    return project(kernel_ops::swiglu(gate_up).view(shape), w.down, invariant);
  }
  return project(at::silu(gate_up.narrow(-1, 0, inter)) * gate_up.narrow(-1, inter, inter), w.down, invariant);
}

HybridOutputs HybridModel::forward(const at::Tensor& input_ids, const at::Tensor& position_ids_in,
                                   const at::Tensor& document_ids_in, const std::vector<int64_t>& layer_ids,
                                   bool want_last_hidden, bool want_logits) const {
  const c10::NoGradGuard no_grad;
  const HybridConfig& c = config_;
  const auto device = embed_.device();
  hf::check_layer_ids(layer_ids, c.num_layers);
  const hf::PackedRows rows = hf::resolve_packed_rows(input_ids, position_ids_in, document_ids_in, c.vocab_size, device);
  const at::Tensor& ids = rows.ids;
  const int64_t b = ids.size(0), s = ids.size(1), n = b * s, h = c.hidden_size;
  // Rows of several documents attend through an additive mask; the linear
  // layers restart their window and state at each document's first token.
  const c10::optional<at::Tensor> mask =
      has_full_attention(c) ? hf::document_causal_mask(rows, embed_.options()) : c10::nullopt;
  const at::Tensor& starts = rows.starts;
  const at::Tensor rotary = has_full_attention(c) ? rotary_cos_sin(rows.positions.reshape({n})) : at::Tensor();
  // The documents as the delta-rule kernels' chunks, once for every linear layer.
  std::optional<kernel_ops::DeltaChunkPlan> chunk_plan;
  if (c.count(Mixer::kLinearAttention) > 0 &&
      gdn::kernels_take(embed_, c.linear_key_heads, c.linear_value_heads, c.linear_key_dim, c.linear_value_dim))
    chunk_plan = kernel_ops::plan_delta_chunks(starts, b, s, device);

  const std::set<int64_t> wanted(layer_ids.begin(), layer_ids.end());
  HybridOutputs out;
  at::Tensor x = embed_.index_select(0, ids.flatten());  // [N, H], the residual stream
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const HybridLayerWeights& w = layers_[static_cast<size_t>(i)];
    const at::Tensor normed = norm_1p(x, w.input_norm, c.rms_norm_eps);
    at::Tensor mixed;
    if (w.mixer == Mixer::kLinearAttention) {
      mixed = linear_attention(c, w.linear, normed.view({b, s, h}), starts, {}, {}, /*recurrent=*/false,
                               /*keep_inputs=*/false, chunk_plan ? &*chunk_plan : nullptr)
                  .out.view({n, h});
    } else {
      const Projected p = project_full(c, w.full, normed, rotary.select(1, 0), rotary.select(1, 1));
      auto heads_first = [&](const at::Tensor& t) { return t.view({b, s, t.size(1), c.head_dim}).transpose(1, 2); };
      const at::Tensor attention = attend(heads_first(p.q), heads_first(p.k), heads_first(p.v), mask, !mask.has_value())
                                       .transpose(1, 2)
                                       .reshape({n, c.num_heads * c.head_dim});
      mixed = finish_full(w.full, attention, p.gate);
    }
    x = x + mixed;
    x = x + mlp(w, norm_1p(x, w.post_attention_norm, c.rms_norm_eps));
    if (wanted.count(i)) out.layers[i] = x.view({b, s, h});
  }
  if (want_last_hidden || want_logits) out.last_hidden = norm_1p(x, final_norm_, c.rms_norm_eps).view({b, s, h});
  if (want_logits) out.logits = at::linear(out.last_hidden, lm_head_);
  if (!want_last_hidden) out.last_hidden = at::Tensor();
  return out;
}

int64_t HybridModel::begin(int64_t capacity) {
  const int64_t id = kv_.begin(capacity);
  SessionStates st;
  st.slot = linear_states_.acquire();
  states_[id] = std::move(st);
  return id;
}

void HybridModel::end(int64_t session) {
  kv_.end(session);
  const auto found = states_.find(session);
  if (found == states_.end()) return;
  linear_states_.release(found->second.slot);
  states_.erase(found);
}

int64_t HybridModel::length(int64_t session) { return kv_.at(session).length; }

void HybridModel::truncate(int64_t session, int64_t length) {
  hf::DecodeSessions::Session& s = kv_.at(session);
  if (length < 0 || length > s.length)
    throw std::invalid_argument("decode_truncate: length " + std::to_string(length) + " is outside [0, " +
                                std::to_string(s.length) + "]");
  if (length == s.length) return;
  SessionStates& st = states_.at(session);
  const int64_t first = st.step_start, kept = length - first, taps = config_.conv_kernel - 1;
  const bool chunked_step = !st.step_replayable;
  const int64_t linear_layers = config_.count(Mixer::kLinearAttention);
  if (linear_layers > 0 && (kept < 0 || (kept > 0 && chunked_step)))
    throw std::invalid_argument(
        "decode_truncate: session " + std::to_string(session) + ": the linear-attention layers keep their state only "
        "within the last decoding step (tokens " + std::to_string(first) + " to " + std::to_string(s.length) + ", " +
        (chunked_step ? "a step of more than " + std::to_string(kRecurrentMaxTokens) + " tokens keeps only its start"
                      : "each token") +
        "); cutting back to " + std::to_string(length) + " would need a state that is gone. Truncate only into the "
        "block just verified, or start a new session");
  if (linear_layers > 0 && kept == 0) {
    linear_states_.flip(st.slot);  // the buffer before the step is current again
  } else if (linear_layers > 0) {
    // The step's first `kept` tokens again, from the state before it: the
    // same operations in the same order (gated_deltanet.h), into the
    // current buffer; the one before the step stays for a shorter cut.
    // Every layer at once: the recurrent rule takes the layers as its rows
    // (a row's numbers do not depend on the others').
    const int64_t now = linear_states_.buffer(st.slot, true), before = linear_states_.buffer(st.slot, false);
    const RuleInputs& in = st.step->rule;
    auto first_kept = [&](const at::Tensor& t) { return t.select(1, st.step_row).narrow(1, 0, kept); };  // [L, kept, ...]
    const at::Tensor state =
        gdn::recurrent_delta_rule(first_kept(in.q), first_kept(in.k), first_kept(in.v), first_kept(in.g),
                                  first_kept(in.beta), linear_states_.all_states().select(1, before))
            .state;
    linear_states_.all_states().select(1, now).copy_(state);
    linear_states_.all_windows().select(1, now).copy_(st.step->inputs.select(1, st.step_row).narrow(1, kept, taps));
  }
  st.step_tokens = kept;
  s.length = length;
}

// A decoding step's shape and what the host knows of it; the step's device
// inputs (tokens, params) come apart, so a CUDA graph can replay it.
struct HybridModel::StepPlan {
  int64_t count = 0, n = 0;
  bool exact = false;      // exact decoding's kernels (exact_step)
  bool recurrent = false;  // the delta rule token by token, its record kept
  std::set<int64_t> wanted;
  HybridLogits logits = HybridLogits::kNone;
  // The usual kernels' attention only (never graphed): the longest session
  // after the step, and whether the sessions' pool rows are first_row, +1, ….
  int64_t keys = 0, first_row = 0;
  bool consecutive_rows = false;
};

struct HybridModel::StepResult {
  HybridOutputs out;
  std::shared_ptr<const StepRecord> record;  // recurrent steps of models with linear layers
};

// The CUDA graphs of single-session exact steps (HybridOptions::decode_graphs),
// with their static inputs and outputs.
struct HybridModel::DecodeGraphs {
  explicit DecodeGraphs(const c10::Device& device) : pool(device) {}
  // Tokens in the step, layers returned, logits.
  using Key = std::tuple<int64_t, std::vector<int64_t>, int>;
  struct Graph : decode_support::GraphedStep {
    at::Tensor tokens, params;  // static inputs: [n] int64, [1, kStepParams] int64
    StepResult out;             // static outputs, in the graphs' memory pool
  };
  decode_support::CudaGraphPool pool;
  std::map<Key, Graph> by_shape;
  // The KV pool's and the linear-state pool's generations the graphs read.
  std::pair<uint64_t, uint64_t> captured_against{~uint64_t{0}, ~uint64_t{0}};
  decode_support::GraphStats stats;
};

namespace {
// A step's per-session parameters, one int64 row each: pool row, cached
// length, current linear-state buffer (linear_state_pool.h).
constexpr int64_t kStepParams = 3;
// Distinct graphed step shapes kept at most.
constexpr size_t kMaxGraphs = 64;
}  // namespace

HybridOutputs HybridModel::extend(const std::vector<int64_t>& ids, const at::Tensor& tokens_in,
                                  const std::vector<int64_t>& layer_ids, HybridLogits logits) {
  const c10::NoGradGuard no_grad;
  const HybridConfig& c = config_;
  const auto device = embed_.device();
  const int64_t count = static_cast<int64_t>(ids.size());
  if (count < 1 || tokens_in.dim() != 2 || tokens_in.size(0) != count || tokens_in.size(1) < 1)
    throw std::invalid_argument("decode_extend: tokens must be [sessions, n] with n >= 1; got " +
                                c10::str(tokens_in.sizes()) + " for " + std::to_string(count) + " sessions");
  const int64_t n = tokens_in.size(1), tokens_in_step = count * n;
  StepPlan plan;
  plan.count = count;
  plan.n = n;
  std::vector<hf::DecodeSessions::Session*> sessions;
  std::set<int64_t> seen;
  for (int64_t id : ids) {
    if (!seen.insert(id).second)
      throw std::invalid_argument("decode_extend_batch: session " + std::to_string(id) + " appears twice in one step");
    hf::DecodeSessions::Session& s = kv_.at(id);
    if (s.length + n > s.capacity)
      throw std::invalid_argument("decode_extend: session " + std::to_string(id) + ": " + std::to_string(n) +
                                  " more tokens would make " + std::to_string(s.length + n) +
                                  ", beyond the session's max_length " + std::to_string(s.capacity));
    sessions.push_back(&s);
    plan.keys = std::max(plan.keys, s.length + n);
  }
  if (tokens_in.device().is_cpu() && tokens_in.numel() > 0) {
    const auto [low, high] = at::aminmax(tokens_in);
    if (low.item<int64_t>() < 0 || high.item<int64_t>() >= c.vocab_size)
      throw std::invalid_argument("decode_extend: token ids outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  }
  hf::check_layer_ids(layer_ids, c.num_layers);
  plan.wanted = std::set<int64_t>(layer_ids.begin(), layer_ids.end());
  plan.logits = logits;
  plan.recurrent = n <= kRecurrentMaxTokens;
  plan.exact = exact_step(tokens_in_step, count > 1 ? "decode_extend_batch" : "decode_extend");
  // Per session: pool row, length (token t is at position length + t) and
  // current linear-state buffer — the step's one upload.
  std::vector<int64_t> params;
  plan.first_row = sessions.front()->row;
  plan.consecutive_rows = true;
  for (int64_t i = 0; i < count; ++i) {
    const hf::DecodeSessions::Session* s = sessions[static_cast<size_t>(i)];
    plan.consecutive_rows = plan.consecutive_rows && s->row == plan.first_row + i;
    params.insert(params.end(), {s->row, s->length, linear_states_.buffer(states_.at(ids[static_cast<size_t>(i)]).slot, true)});
  }
  // Uploads through page-locked memory without waiting for the device: a
  // pageable copy would make every step wait for the one before.
  const at::Tensor tokens = decode_support::ids_on(tokens_in, device).reshape({tokens_in_step});
  StepResult result;
  const bool graphed = graphs_ && plan.exact && count == 1 && step_graphed(plan, tokens, params, layer_ids, result);
  if (!graphed) result = step(plan, tokens, decode_support::upload(params, device).view({count, kStepParams}));

  // The step wrote the new windows and states to the buffers not current;
  // only now, with nothing left to throw, do the sessions make them current.
  const bool linear = c.count(Mixer::kLinearAttention) > 0;
  for (int64_t i = 0; i < count; ++i) {
    SessionStates& st = states_.at(ids[static_cast<size_t>(i)]);
    st.step_start = sessions[static_cast<size_t>(i)]->length;
    st.step_tokens = n;
    st.step_replayable = plan.recurrent;
    st.step = result.record;
    st.step_row = i;
    if (linear) linear_states_.flip(st.slot);
    sessions[static_cast<size_t>(i)]->length += n;
  }
  return std::move(result.out);
}

HybridModel::StepResult HybridModel::step(const StepPlan& plan, const at::Tensor& tokens, const at::Tensor& params) {
  const HybridConfig& c = config_;
  const int64_t count = plan.count, n = plan.n, tokens_in_step = count * n, h = c.hidden_size;
  const at::Tensor rows = params.select(1, 0).contiguous(), lengths = params.select(1, 1);
  const auto long_options = params.options();
  const at::Tensor positions = (lengths.unsqueeze(1) + at::arange(n, long_options).unsqueeze(0)).reshape({tokens_in_step});
  const int64_t capacity = kv_.row_capacity();
  const at::Tensor slots = (rows.unsqueeze(1) * capacity).expand({count, n}).reshape({tokens_in_step}) + positions;
  at::Tensor rotary;
  c10::optional<at::Tensor> mask;  // query t of session i sees keys [0, length_i + t]
  at::Tensor cu_k, seqused_k;      // or, exact: where each session's keys start in the pool, and their count
  if (has_full_attention(c)) {
    rotary = rotary_cos_sin(positions);
    if (plan.exact) {
      cu_k = at::cat({rows * capacity, at::full({1}, kv_.rows() * capacity, long_options)}).to(at::kInt);
      seqused_k = (lengths + n).to(at::kInt);
    } else {
      mask = at::zeros({count, 1, n, plan.keys}, embed_.options())
                 .masked_fill_(at::arange(plan.keys, long_options).view({1, 1, 1, plan.keys}).gt(positions.view({count, 1, n, 1})),
                               -std::numeric_limits<float>::infinity());
    }
  }
  // The linear layers' carried windows and states: each session's current
  // buffers in, the other ones out (linear_state_pool.h).
  const int64_t linear_layers = c.count(Mixer::kLinearAttention);
  std::vector<LinearResult> linear_results(static_cast<size_t>(linear_layers));
  const at::Tensor current_buffers = params.select(1, 2).contiguous();
  const at::Tensor next_buffers = current_buffers.bitwise_xor(1);  // a slot's buffers are rows 2s and 2s + 1

  StepResult result;
  HybridOutputs& out = result.out;
  at::Tensor x = embed_.index_select(0, tokens);  // [count·n, H]
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const HybridLayerWeights& w = layers_[static_cast<size_t>(i)];
    const at::Tensor normed = norm_1p(x, w.input_norm, c.rms_norm_eps);
    at::Tensor mixed;
    if (w.mixer == Mixer::kLinearAttention) {
      const size_t l = static_cast<size_t>(linear_index_[static_cast<size_t>(i)]);
      linear_results[l] = linear_attention(c, w.linear, normed.view({count, n, h}), {},
                                            linear_states_.windows(l).index_select(0, current_buffers),
                                            linear_states_.states(l).index_select(0, current_buffers), plan.recurrent,
                                            /*keep_inputs=*/true, nullptr, plan.exact);
      mixed = linear_results[l].out.view({tokens_in_step, h});
    } else {
      const int64_t f = full_index_[static_cast<size_t>(i)], hd = c.head_dim;
      at::Tensor& key_pool = kv_.keys(f);
      at::Tensor& value_pool = kv_.values(f);
      const Projected p = project_into_cache(c, w.full, normed, rotary, key_pool, value_pool, slots, plan.exact);
      // [count, kv, keys, hd]: only the keys in use are gathered (not each
      // row's whole capacity), and consecutive rows are not copied at all.
      auto cached = [&](const at::Tensor& pool) {
        const at::Tensor used = pool.narrow(1, 0, plan.keys);
        return (plan.consecutive_rows ? used.narrow(0, plan.first_row, count) : used.index_select(0, rows)).transpose(1, 2);
      };
      const at::Tensor attention =
          plan.exact ? kernel_ops::invariant_decode_attention(p.q, key_pool.view({-1, c.num_kv_heads, hd}),
                                                              value_pool.view({-1, c.num_kv_heads, hd}), cu_k, seqused_k,
                                                              n, capacity)
                     : attend(p.q.view({count, n, c.num_heads, hd}).transpose(1, 2), cached(key_pool),
                              cached(value_pool), mask, false)
                           .transpose(1, 2)
                           .reshape({tokens_in_step, c.num_heads * hd});
      mixed = finish_full(w.full, attention, p.gate, plan.exact);
    }
    x = x + mixed;
    x = x + mlp(w, norm_1p(x, w.post_attention_norm, c.rms_norm_eps), plan.exact);
    if (plan.wanted.count(i)) out.layers[i] = x.view({count, n, h});
  }
  if (plan.logits == HybridLogits::kAll)
    out.logits = project(norm_1p(x, final_norm_, c.rms_norm_eps), lm_head_, plan.exact).view({count, n, c.vocab_size});
  if (plan.logits == HybridLogits::kLast)
    out.logits =
        project(norm_1p(x.view({count, n, h}).select(1, n - 1), final_norm_, c.rms_norm_eps), lm_head_, plan.exact)
            .unsqueeze(1);

  // The new windows and states into the buffers not current.
  const int64_t taps = c.conv_kernel - 1;
  std::vector<at::Tensor> step_inputs;
  std::vector<RuleInputs> step_rule;
  for (size_t l = 0; l < linear_results.size(); ++l) {
    const LinearResult& r = linear_results[l];
    linear_states_.windows(l).index_copy_(0, next_buffers, r.inputs.narrow(1, n, taps));
    linear_states_.states(l).index_copy_(0, next_buffers, r.delta.state);
    step_inputs.push_back(r.inputs);
    step_rule.push_back(r.rule);
  }
  if (plan.recurrent && linear_layers > 0) result.record = stacked_record(step_inputs, step_rule);
  return result;
}

// A single session's exact step through a CUDA graph, captured on a shape's
// second use and replayed from then on; false: run it eagerly (first use, a
// failed capture, too many shapes).
bool HybridModel::step_graphed(const StepPlan& plan, const at::Tensor& tokens, const std::vector<int64_t>& params,
                               const std::vector<int64_t>& layer_ids, StepResult& result) {
  DecodeGraphs& d = *graphs_;
  const std::pair<uint64_t, uint64_t> against{kv_.generation(), linear_states_.generation()};
  if (against != d.captured_against) {  // a pool moved: every graph reads stale addresses
    d.by_shape.clear();
    d.pool.renew();
    d.captured_against = against;
  }
  const DecodeGraphs::Key key{plan.n, layer_ids, static_cast<int>(plan.logits)};
  auto found = d.by_shape.find(key);
  if (found == d.by_shape.end()) {
    if (d.by_shape.size() >= kMaxGraphs) return false;
    found = d.by_shape.emplace(key, DecodeGraphs::Graph{}).first;
  }
  DecodeGraphs::Graph& g = found->second;
  if (!g.take()) return false;  // the first use of a shape runs eagerly
  const auto device = embed_.device();
  if (!g.graph) {
    g.tokens = at::empty({plan.n}, at::TensorOptions().dtype(at::kLong).device(device));
    g.params = at::empty({1, kStepParams}, at::TensorOptions().dtype(at::kLong).device(device));
  }
  // This step's inputs into the static buffers (asynchronous copies).
  g.tokens.copy_(tokens);
  g.params.copy_(decode_support::host_staging(params, device).view({1, kStepParams}), /*non_blocking=*/true);
  // A capture's warm-up and the replay write the same keys, values, windows
  // and states (the step reads the current buffers and writes the other ones).
  if (!d.pool.replay(g, d.stats, [&] { g.out = step(plan, g.tokens, g.params); })) {
    g.out = StepResult{};
    return false;
  }
  // The outputs live in the graphs' pool, which the next replay reuses: the
  // caller gets its own copies.
  result = StepResult{};
  for (const auto& [layer, tensor] : g.out.out.layers) result.out.layers[layer] = tensor.clone();
  if (g.out.out.logits.defined()) result.out.logits = g.out.out.logits.clone();
  if (g.out.record) {
    const StepRecord& r = *g.out.record;
    auto copy = std::make_shared<StepRecord>();
    copy->inputs = r.inputs.clone();
    copy->rule = {r.rule.q.clone(), r.rule.k.clone(), r.rule.v.clone(), r.rule.g.clone(), r.rule.beta.clone()};
    result.record = std::move(copy);
  }
  return true;
}

const decode_support::GraphStats& HybridModel::decode_graph_stats() const {
  static const decode_support::GraphStats none;
  return graphs_ ? graphs_->stats : none;
}

HybridOutputs HybridModel::verify_tree(int64_t id, const at::Tensor& tokens_in, const std::vector<int64_t>& parents,
                                       const std::vector<int64_t>& layer_ids, bool want_logits) {
  const c10::NoGradGuard no_grad;
  const HybridConfig& c = config_;
  const auto device = embed_.device();
  const int64_t n = static_cast<int64_t>(parents.size()), h = c.hidden_size;
  const std::vector<int64_t> depths =
      decode_support::checked_tree_depths(id, tokens_in.numel(), parents, kv_.at(id).length, kv_.at(id).capacity);
  if (tokens_in.device().is_cpu()) {
    const auto [low, high] = at::aminmax(tokens_in);
    if (low.item<int64_t>() < 0 || high.item<int64_t>() >= c.vocab_size)
      throw std::invalid_argument("decode_verify_tree: token ids outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  }
  hf::check_layer_ids(layer_ids, c.num_layers);
  const std::set<int64_t> wanted(layer_ids.begin(), layer_ids.end());
  const at::Tensor tokens = decode_support::ids_on(tokens_in.reshape({n}), device);
  if (has_full_attention(c)) kv_.reserve_row_capacity(kv_.at(id).length + n);  // the nodes' rows, in node order
  hf::DecodeSessions::Session& s = kv_.at(id);
  SessionStates& st = states_.at(id);

  // The nodes by depth; where each lies in that order (rank) and, past depth
  // 1, which row of the level above holds its parent.
  const int64_t deepest = *std::max_element(depths.begin(), depths.end());
  std::vector<std::vector<int64_t>> levels(static_cast<size_t>(deepest));
  for (int64_t i = 0; i < n; ++i) levels[static_cast<size_t>(depths[static_cast<size_t>(i)] - 1)].push_back(i);
  std::vector<int64_t> rank(static_cast<size_t>(n)), local(static_cast<size_t>(n));
  std::vector<at::Tensor> level_nodes, level_parents;
  for (size_t d = 0, at_rank = 0; d < levels.size(); ++d) {
    std::vector<int64_t> parent_rows;
    for (size_t j = 0; j < levels[d].size(); ++j) {
      const int64_t node = levels[d][j];
      rank[static_cast<size_t>(node)] = static_cast<int64_t>(at_rank++);
      local[static_cast<size_t>(node)] = static_cast<int64_t>(j);
      if (d > 0) parent_rows.push_back(local[static_cast<size_t>(parents[static_cast<size_t>(node)])]);
    }
    level_nodes.push_back(decode_support::upload(levels[d], device));
    level_parents.push_back(d > 0 ? decode_support::upload(parent_rows, device) : at::Tensor());
  }
  const at::Tensor node_order = decode_support::upload(rank, device);  // level order → node order

  // The full-attention layers: positions by depth, keys at rows length + i,
  // each node seeing the cache, its ancestors and itself.
  const int64_t keys = s.length + n;
  at::Tensor rotary, slots;
  c10::optional<at::Tensor> mask;
  if (has_full_attention(c)) {
    std::vector<int64_t> positions, rows;
    for (int64_t i = 0; i < n; ++i) {
      positions.push_back(s.length + depths[static_cast<size_t>(i)] - 1);
      rows.push_back(s.row * kv_.row_capacity() + s.length + i);
    }
    rotary = rotary_cos_sin(decode_support::upload(positions, device));
    slots = decode_support::upload(rows, device);
    at::Tensor visible = at::zeros({n, keys}, at::kBool);
    visible.narrow(1, 0, s.length).fill_(true);
    bool* v = visible.data_ptr<bool>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t a = i; a >= 0; a = parents[static_cast<size_t>(a)]) v[i * keys + s.length + a] = true;
    mask = at::zeros({1, 1, n, keys}, embed_.options())
               .masked_fill_(decode_support::on_device(visible, device).logical_not().view({1, 1, n, keys}),
                             -std::numeric_limits<float>::infinity());
  }

  const int64_t current = linear_states_.buffer(st.slot, true), taps = c.conv_kernel - 1;
  auto record = std::make_shared<TreeRecord>();
  HybridOutputs out;
  at::Tensor x = embed_.index_select(0, tokens);  // [n, H]
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const HybridLayerWeights& w = layers_[static_cast<size_t>(i)];
    const at::Tensor normed = norm_1p(x, w.input_norm, c.rms_norm_eps);
    at::Tensor mixed;
    if (w.mixer == Mixer::kLinearAttention) {
      const size_t l = static_cast<size_t>(linear_index_[static_cast<size_t>(i)]);
      const at::Tensor window0 = linear_states_.windows(l)[current], state0 = linear_states_.states(l)[current];
      at::Tensor windows, states;  // the level above's, per node of it
      std::vector<at::Tensor> outs, convs, qs, ks, vs, gs, betas;
      for (size_t d = 0; d < levels.size(); ++d) {
        const int64_t m = static_cast<int64_t>(levels[d].size());
        const at::Tensor window = d == 0 ? window0.unsqueeze(0).expand({m, taps, window0.size(-1)}).contiguous()
                                         : windows.index_select(0, level_parents[d]);
        const at::Tensor initial = d == 0 ? state0.unsqueeze(0).expand({m, state0.size(0), state0.size(1), state0.size(2)}).contiguous()
                                          : states.index_select(0, level_parents[d]);
        const LinearResult r = linear_attention(c, w.linear, normed.index_select(0, level_nodes[d]).view({m, 1, h}), {}, window,
                                                initial, /*recurrent=*/true, /*keep_inputs=*/true);
        windows = r.inputs.narrow(1, 1, taps);
        states = r.delta.state;
        outs.push_back(r.out.view({m, h}));
        convs.push_back(r.inputs.select(1, taps));
        qs.push_back(r.rule.q);
        ks.push_back(r.rule.k);
        vs.push_back(r.rule.v);
        gs.push_back(r.rule.g);
        betas.push_back(r.rule.beta);
      }
      auto in_node_order = [&](const std::vector<at::Tensor>& parts) { return at::cat(parts).index_select(0, node_order); };
      mixed = in_node_order(outs);
      record->conv_inputs.push_back(in_node_order(convs));
      record->rule.push_back({in_node_order(qs), in_node_order(ks), in_node_order(vs), in_node_order(gs), in_node_order(betas)});
    } else {
      const int64_t f = full_index_[static_cast<size_t>(i)], hd = c.head_dim;
      at::Tensor& key_pool = kv_.keys(f);
      at::Tensor& value_pool = kv_.values(f);
      const Projected p = project_into_cache(c, w.full, normed, rotary, key_pool, value_pool, slots);
      auto cached = [&](const at::Tensor& pool) { return pool.narrow(1, 0, keys).narrow(0, s.row, 1).transpose(1, 2); };
      const at::Tensor attention =
          attend(p.q.view({1, n, c.num_heads, hd}).transpose(1, 2), cached(key_pool), cached(value_pool), mask, false)
              .transpose(1, 2)
              .reshape({n, c.num_heads * hd});
      mixed = finish_full(w.full, attention, p.gate);
    }
    x = x + mixed;
    x = x + mlp(w, norm_1p(x, w.post_attention_norm, c.rms_norm_eps));
    if (wanted.count(i)) out.layers[i] = x.view({1, n, h});
  }
  if (want_logits) out.logits = at::linear(norm_1p(x, final_norm_, c.rms_norm_eps), lm_head_).view({1, n, c.vocab_size});
  // Only now, with nothing left to throw: the tree is the session's until accept_path.
  st.tree = record;
  s.length += n;
  return out;
}

void HybridModel::accept_path(int64_t id, int64_t tree_start, const std::vector<int64_t>& path) {
  const c10::NoGradGuard no_grad;
  const HybridConfig& c = config_;
  const auto device = embed_.device();
  hf::DecodeSessions::Session& s = kv_.at(id);
  SessionStates& st = states_.at(id);
  if (!st.tree) throw std::invalid_argument("decode_accept_path: session " + std::to_string(id) + " has no verified draft tree");
  const int64_t m = static_cast<int64_t>(path.size());
  // The full-attention layers: the path's rows next to each other.
  if (has_full_attention(c)) kv_.keep_path(id, tree_start, path);
  // The linear layers: the rule replayed along the path from the state
  // before the tree, into the other buffer, which then becomes current; the
  // path is the session's last step (truncate may cut back into it).
  const int64_t linear_layers = c.count(Mixer::kLinearAttention), taps = c.conv_kernel - 1;
  if (linear_layers > 0 && m > 0) {
    const at::Tensor picked = decode_support::upload(path, device);
    const int64_t now = linear_states_.buffer(st.slot, true), next = linear_states_.buffer(st.slot, false);
    std::vector<at::Tensor> step_inputs;
    std::vector<RuleInputs> step_rule;
    for (size_t l = 0; l < static_cast<size_t>(linear_layers); ++l) {
      const RuleInputs& in = st.tree->rule[l];
      auto along = [&](const at::Tensor& t) { return t.index_select(0, picked).transpose(0, 1); };  // [m, 1, ...] → [1, m, ...]
      const RuleInputs kept{along(in.q), along(in.k), along(in.v), along(in.g), along(in.beta)};
      const at::Tensor state = gdn::recurrent_delta_rule(kept.q, kept.k, kept.v, kept.g, kept.beta,
                                                         linear_states_.states(l).narrow(0, now, 1))
                                   .state;
      linear_states_.states(l).narrow(0, next, 1).copy_(state);
      const at::Tensor inputs =
          at::cat({linear_states_.windows(l).narrow(0, now, 1), st.tree->conv_inputs[l].index_select(0, picked).unsqueeze(0)}, 1);
      linear_states_.windows(l)[next].copy_(inputs[0].narrow(0, m, taps));
      step_inputs.push_back(inputs);
      step_rule.push_back(kept);
    }
    linear_states_.flip(st.slot);
    st.step = stacked_record(step_inputs, step_rule);
    st.step_row = 0;
  }
  st.step_start = tree_start;
  st.step_tokens = m;
  st.step_replayable = true;
  st.tree.reset();
  s.length = tree_start + m;
}

}  // namespace dflash::target
