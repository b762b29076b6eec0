#include "decoder.h"

#include "fast_path.h"

#include <checkpoint.h>
#include <cuda_graph.h>
#include <pending_trees.h>
#include <kernel_ops.h>
#include <moe.h>
#include <target_outputs.h>
#include <dflash/sdk/memory_plan.hpp>
#include <dflash/sdk/torch_compat.hpp>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <tuple>

namespace dflash::target {
namespace fs = std::filesystem;

namespace {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // As Hugging Face does: normalise in fp32 (fp64 for fp64), cast back, then scale.
  const at::Tensor f = x.to(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  const at::Tensor normed = f * at::rsqrt(f.pow(2).mean(-1, true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor rope_inverse_frequencies(const DecoderConfig& c) {
  at::Tensor inv = 1.0 / at::pow(c.rope_theta, at::arange(0, c.head_dim, 2, at::kDouble) / static_cast<double>(c.head_dim));
  if (c.rope_scaling.type == "llama3") {
    const auto& r = c.rope_scaling;
    const double old_context = static_cast<double>(r.original_max_position_embeddings);
    const double low_wavelen = old_context / r.low_freq_factor, high_wavelen = old_context / r.high_freq_factor;
    const at::Tensor wavelen = 2 * M_PI / inv;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv / r.factor, inv);
    const at::Tensor smooth = (old_context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    const at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
    const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv = at::where(medium, smoothed, scaled);
  }
  return inv;  // fp64: angles are formed in fp64 and rounded once, to the activations' dtype
}

}  // namespace

DecoderMemory plan_decoder_memory(const fs::path& dir, c10::ScalarType dtype, const c10::Device& device,
                                  const DecoderOptions& options, int64_t rows, int64_t row_length) {
  DecoderMemory m;
  m.config = read_decoder_config(dir / "config.json");
  const DecoderConfig& c = m.config;
  const hf::Checkpoint ckpt(dir);  // headers only: the files are mapped, not read
  const double e = static_cast<double>(c10::elementSize(dtype));
  const double h = static_cast<double>(c.hidden_size), inter = static_cast<double>(c.intermediate_size);
  const double hd = static_cast<double>(c.head_dim), heads = static_cast<double>(c.num_heads);
  const double qkv_out = static_cast<double>(c.num_heads + 2 * c.num_kv_heads) * hd;
  const double q_out = heads * hd, vocab = static_cast<double>(c.vocab_size);
  // Exactly what the constructor keeps: embedding, final norm, lm_head unless
  // tied, and per layer two norms, qkv (+ bias), o, q/k norms, and the MLP:
  // gate_up and down, or a sparse layer's router and experts.
  double elements = vocab * h + h + (ckpt.has("lm_head.weight") ? vocab * h : 0.0);
  const bool bias = ckpt.has("model.layers.0.self_attn.q_proj.bias");
  const double attention = 2 * h + qkv_out * h + (bias ? qkv_out : 0.0) + h * q_out + (c.qk_norm ? 2 * hd : 0.0);
  const double layers = static_cast<double>(c.num_layers), sparse = static_cast<double>(
      std::count(c.sparse_layers.begin(), c.sparse_layers.end(), true));
  elements += layers * attention + (layers - sparse) * 3 * inter * h +
              sparse * hf::moe_weight_elements(c.moe, c.hidden_size);
  m.weight_bytes = sdk::MemoryPlan::saturated_bytes(elements * e);
  m.cuda_kernels = options.cuda_kernels && device.is_cuda() && fast_path::available() &&
                   (dtype == at::kBFloat16 || dtype == at::kHalf) && c.head_dim <= 256;
  // One forward: the residual stream, the rotary tables, and the largest of
  // a layer's attention half (norm, qkv, q/k/v after RoPE, attention output)
  // and its MLP half — over every token, as the streams' micro-batches
  // together cover the batch. The dense MLP half: norm, gate_up, silu·up. A
  // sparse one (hf::moe_forward, k experts a token): norm, router logits and
  // their fp32 softmax, the block's output, and at its peak the tokens'
  // routed copies, the experts' outputs and one expert's down GEMM before
  // its copy into them (at most N·k·H each), with gate_up and silu·up over
  // the largest expert's slice (at most every pair: N·k·3I).
  const double tokens = static_cast<double>(rows) * static_cast<double>(row_length);
  double attention_half = tokens * e * (h + 2 * qkv_out + q_out);
  const double k = static_cast<double>(c.moe.top_k), experts = static_cast<double>(c.moe.experts);
  const double dense_half = sparse < layers ? tokens * e * (h + 3 * inter) : 0.0;
  const double sparse_half =
      sparse > 0 ? tokens * e * (2 * h + experts * (1 + 4.0 / e) + k * (3 * h + 3 * static_cast<double>(c.moe.intermediate))) : 0.0;
  double norm_temporaries = 0;
  if (!m.cuda_kernels) {
    // The ATen path: fp32 norm temporaries (before either half), K/V repeated
    // to every head and (off CUDA) SDPA's math path with its [heads, S, S]
    // scores and probabilities per row (the attention half's, freed before
    // the MLP half).
    norm_temporaries = tokens * h * 8.0;
    attention_half += tokens * q_out * e * 2;
    if (!device.is_cuda())
      attention_half += static_cast<double>(rows) * heads * static_cast<double>(row_length) * static_cast<double>(row_length) * e * 2;
  }
  const double bytes = tokens * e * h /* the residual stream */ +
                       std::max({attention_half, dense_half, sparse_half, norm_temporaries}) +
                       tokens * hd * 8.0 /* fp64 angles */ + tokens * hd * (m.cuda_kernels ? 4.0 : e) /* cos, sin */;
  m.forward_bytes = sdk::MemoryPlan::saturated_bytes(bytes);
  // The GPU forward splits the rows over this many CUDA streams of its own
  // (forward_kernels); each keeps a cuBLAS workspace, which the host counts.
  const int64_t groups = std::max<int64_t>(1, std::min<int64_t>(options.streams, rows));
  m.side_streams = m.cuda_kernels && groups > 1 ? groups : 0;
  return m;
}

Decoder::Decoder(const fs::path& dir, c10::ScalarType dtype, c10::Device device, const DecoderOptions& options)
    : config_(read_decoder_config(dir / "config.json")), streams_(options.streams) {
  const DecoderConfig& c = config_;
  // Refused before any weight is read. The experts' GEMMs run over the tokens
  // routed to each in a step, so a token's numbers depend on the tokens
  // beside it: there are no row-invariant kernels for them.
  const bool experts = c.has_experts();
  if (options.exact_decoding == DecoderOptions::Exact::kOn && experts)
    throw std::runtime_error(dir.string() + ": exact_decoding: on is not available for a Mixture-of-Experts model (" +
                             c.model_type + ", " + std::to_string(c.moe.experts) +
                             " experts): each expert's GEMM runs over the tokens routed to it in a step, so a token's "
                             "numbers depend on the tokens beside it; set exact_decoding: auto or off");
  const hf::Checkpoint ckpt(dir);
  const int64_t h = c.hidden_size, hd = c.head_dim, q_out = c.num_heads * hd, kv_out = c.num_kv_heads * hd;
  embed_ = ckpt.get("model.embed_tokens.weight", {c.vocab_size, h}, dtype, device);
  final_norm_ = ckpt.get("model.norm.weight", {h}, dtype, device);
  if (ckpt.has("lm_head.weight")) lm_head_ = ckpt.get("lm_head.weight", {c.vocab_size, h}, dtype, device);
  else if (c.tie_word_embeddings) lm_head_ = embed_;
  else throw std::runtime_error(dir.string() + ": lm_head.weight is missing and tie_word_embeddings is false");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights w;
    w.input_norm = ckpt.get(p + "input_layernorm.weight", {h}, dtype, device);
    w.post_attention_norm = ckpt.get(p + "post_attention_layernorm.weight", {h}, dtype, device);
    w.qkv = at::cat({ckpt.get(p + "self_attn.q_proj.weight", {q_out, h}, dtype, device),
                     ckpt.get(p + "self_attn.k_proj.weight", {kv_out, h}, dtype, device),
                     ckpt.get(p + "self_attn.v_proj.weight", {kv_out, h}, dtype, device)});
    w.o = ckpt.get(p + "self_attn.o_proj.weight", {h, q_out}, dtype, device);
    if (ckpt.has(p + "self_attn.q_proj.bias")) {
      w.qkv_bias = at::cat({ckpt.get(p + "self_attn.q_proj.bias", {q_out}, dtype, device),
                            ckpt.get(p + "self_attn.k_proj.bias", {kv_out}, dtype, device),
                            ckpt.get(p + "self_attn.v_proj.bias", {kv_out}, dtype, device)});
    }
    if (c.qk_norm) {
      w.q_norm = ckpt.get(p + "self_attn.q_norm.weight", {hd}, dtype, device);
      w.k_norm = ckpt.get(p + "self_attn.k_norm.weight", {hd}, dtype, device);
    }
    if (c.is_sparse(i)) {
      w.moe = hf::load_moe(ckpt, p + "mlp.", c.moe, h, dtype, device);
    } else {
      w.gate_up = at::cat({ckpt.get(p + "mlp.gate_proj.weight", {c.intermediate_size, h}, dtype, device),
                           ckpt.get(p + "mlp.up_proj.weight", {c.intermediate_size, h}, dtype, device)});
      w.down = ckpt.get(p + "mlp.down_proj.weight", {h, c.intermediate_size}, dtype, device);
    }
    layers_.push_back(std::move(w));
  }
  inv_freq_ = rope_inverse_frequencies(c).to(device);
  cuda_kernels_ = options.cuda_kernels && fast_path::available() && fast_path::supports(embed_, hd);
  cudnn_attention_ = cuda_kernels_ && options.cudnn_attention &&
                     fast_path::cudnn_attention_works(embed_, c.num_heads, c.num_kv_heads, hd);
  flash_decoding_ = cuda_kernels_ && fast_path::decode_attention_supported(hd);
  // A step with experts reads each expert's token count back to the host
  // (hf::moe_forward), which a CUDA graph cannot capture.
  decode_graphs_ = options.decode_graphs && flash_decoding_ && decode_support::kCudaGraphs && !experts;
  if (options.exact_decoding != DecoderOptions::Exact::kOff) {
    exact_required_ = options.exact_decoding == DecoderOptions::Exact::kOn;
    // Every projection's input width must take the invariant kernels' 8-wide loads.
    const bool widths = h % 8 == 0 && q_out % 8 == 0 && c.intermediate_size % 8 == 0;
    const bool possible = !experts && flash_decoding_ && widths && kernel_ops::invariant_decode_attention_fits(hd, 1);
    if (exact_required_ && !possible)
      throw std::runtime_error(
          dir.string() + ": exact_decoding: on needs the GPU decoding path (a CUDA device, bf16/fp16, kernels: auto, "
          "LibTorch >= 2.5; here " + std::string(flash_decoding_ ? "present" : "absent") +
          ") and hidden_size, heads·head_dim, intermediate_size and head_dim (at most 256) all multiples of 8 (here " +
          std::to_string(h) + ", " + std::to_string(q_out) + ", " + std::to_string(c.intermediate_size) + ", " +
          std::to_string(hd) + "); set exact_decoding: auto or off");
    exact_decoding_ = possible;
  }
  decode_ = std::make_unique<DecodeState>(device);
}

namespace {

// x + a·wᵀ as one GEMM with the residual as its C operand. In place, unless x
// is also a returned hidden state (the caller must keep it).
// invariant: exact decoding's row-invariant kernel instead of cuBLAS.
at::Tensor add_projection(at::Tensor& x, const at::Tensor& a, const at::Tensor& w, bool& x_is_returned,
                          bool invariant = false) {
  if (x_is_returned) {
    x_is_returned = false;
    return invariant ? kernel_ops::invariant_linear(a, w, {}, x) : at::addmm(x, a, w.t());
  }
  if (invariant) {
    kernel_ops::invariant_add_linear_(x, a, w);
    return x;
  }
  return x.addmm_(a, w.t());
}


// The rotary tables of N positions (angles [N, hd/2], fp64) in the layout
// the path reads: [N, 1, hd] in the activations' dtype (ATen), or fp32
// [N, hd/2] (our kernels).
struct Rotary {
  at::Tensor cos, sin;
};
Rotary rotary(const at::Tensor& angles, c10::ScalarType dtype, bool kernels) {
  if (kernels) return {angles.cos().to(at::kFloat).contiguous(), angles.sin().to(at::kFloat).contiguous()};
  const at::Tensor emb = at::cat({angles, angles}, -1).unsqueeze(1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor norm(const DecoderConfig& c, const at::Tensor& x, const at::Tensor& weight, bool kernels) {
  return kernels ? kernel_ops::rms_norm(x, weight, c.rms_norm_eps) : rms_norm(x, weight, c.rms_norm_eps);
}

// One layer's queries, keys and values on the ATen path (tables in its
// layout): input RMSNorm, the fused qkv GEMM, Qwen3's q/k norm, RoPE. The
// kernel paths run qk_norm_rope (the forward) or qk_norm_rope_into_cache
// (decoding) instead. x [N, H]. q [N, heads, hd]; k, v [N, kv_heads, hd].
struct QKV {
  at::Tensor q, k, v;
};
QKV project_qkv(const DecoderConfig& c, const LayerWeights& w, const at::Tensor& x, const Rotary& r) {
  const int64_t n = x.size(0), heads = c.num_heads, kv_heads = c.num_kv_heads, hd = c.head_dim;
  const at::Tensor qkv = kernel_ops::linear(norm(c, x, w.input_norm, false), w.qkv, w.qkv_bias, false);  // [N, (heads + 2 kv) hd]
  at::Tensor q = qkv.narrow(1, 0, heads * hd).reshape({n, heads, hd});
  at::Tensor k = qkv.narrow(1, heads * hd, kv_heads * hd).reshape({n, kv_heads, hd});
  const at::Tensor v = qkv.narrow(1, (heads + kv_heads) * hd, kv_heads * hd).reshape({n, kv_heads, hd});
  if (c.qk_norm) {
    q = rms_norm(q, w.q_norm, c.rms_norm_eps);
    k = rms_norm(k, w.k_norm, c.rms_norm_eps);
  }
  return {q * r.cos + rotate_half(q) * r.sin, k * r.cos + rotate_half(k) * r.sin, v};
}

// The MLP half of a layer, the one place every path runs it: the post-
// attention norm, then the dense SwiGLU (its down GEMM adding into x, as
// add_projection) or a sparse layer's experts (hf::moe_forward), added to
// the residual stream x — in place unless x is a returned hidden state.
at::Tensor add_mlp(const DecoderConfig& c, const LayerWeights& w, at::Tensor x, bool& x_is_returned, bool kernels,
                   bool invariant) {
  const at::Tensor normed = norm(c, x, w.post_attention_norm, kernels);
  if (w.moe) {
    const at::Tensor routed = hf::moe_forward(*w.moe, c.moe, normed);
    if (!x_is_returned) return x.add_(routed);
    x_is_returned = false;
    return x + routed;
  }
  const at::Tensor gate_up = kernel_ops::linear(normed, w.gate_up, {}, invariant);  // [N, 2 I]
  const int64_t inter = c.intermediate_size;
  const at::Tensor act = kernels ? kernel_ops::swiglu(gate_up) : at::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter);
  return add_projection(x, act, w.down, x_is_returned, invariant);
}

// The rest of the layer after attention [N, heads·hd]: the o projection and
// the MLP, each added to the residual stream x.
at::Tensor finish_layer(const DecoderConfig& c, const LayerWeights& w, at::Tensor x, const at::Tensor& attention,
                        bool& x_is_returned, bool kernels = false, bool invariant = false) {
  x = add_projection(x, attention, w.o, x_is_returned, invariant);
  return add_mlp(c, w, x, x_is_returned, kernels, invariant);
}

}  // namespace

DecoderOutputs Decoder::forward(const at::Tensor& input_ids_in, const at::Tensor& position_ids_in,
                                const at::Tensor& document_ids_in, const std::vector<int64_t>& layer_ids,
                                bool want_last_hidden, bool want_logits) const {
  const c10::NoGradGuard no_grad;
  const DecoderConfig& c = config_;
  const auto device = embed_.device();
  hf::check_layer_ids(layer_ids, c.num_layers);
  // Documents and positions of a packed batch (hf_support/packed_rows.h).
  PackedBatch batch{{hf::resolve_packed_rows(input_ids_in, position_ids_in, document_ids_in, c.vocab_size, device)}, {}};
  const int64_t n = batch.ids.numel();
  batch.angles = batch.positions.reshape({n}).to(at::kDouble).unsqueeze(-1) * inv_freq_;  // [N, hd/2], fp64
  const std::set<int64_t> wanted(layer_ids.begin(), layer_ids.end());
  DecoderOutputs out = cuda_kernels_ && n > 0 ? forward_kernels(batch, wanted, want_last_hidden || want_logits)
                                              : forward_reference(batch, wanted, want_last_hidden || want_logits);
  if (want_logits) out.logits = at::linear(out.last_hidden, lm_head_);
  if (!want_last_hidden) out.last_hidden = at::Tensor();
  return out;
}

// The GPU path: the batch's rows split into micro-batches, each on its own
// CUDA stream, interleaved layer by layer — one micro-batch's memory-bound
// kernels and attention overlap another's GEMMs. Documents never cross rows,
// so the split changes no arithmetic.
DecoderOutputs Decoder::forward_kernels(const PackedBatch& batch, const std::set<int64_t>& wanted,
                                        bool want_last_hidden) const {
  const DecoderConfig& c = config_;
  const int64_t b = batch.ids.size(0), s = batch.ids.size(1), n = b * s, h = c.hidden_size;
  const int64_t heads = c.num_heads, kv_heads = c.num_kv_heads, hd = c.head_dim;
  const at::Tensor cos = batch.angles.cos().to(at::kFloat).contiguous();
  const at::Tensor sin = batch.angles.sin().to(at::kFloat).contiguous();

  struct MicroBatch {
    int64_t first_token = 0, tokens = 0, rows = 0, max_document = 0;
    bool one_document_per_row = true;
    at::Tensor cu_seqlens;  // int32 document offsets within the micro-batch
  };
  const int64_t groups = std::max<int64_t>(1, std::min<int64_t>(streams_, b));
  std::vector<MicroBatch> micro(groups);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first_row = g * b / groups, rows = (g + 1) * b / groups - first_row;
    MicroBatch& m = micro[g];
    m.first_token = first_row * s;
    m.tokens = rows * s;
    m.rows = rows;
    if (batch.starts.defined()) {
      const at::Tensor first = batch.starts.narrow(0, first_row, rows).flatten().nonzero().flatten();
      m.one_document_per_row = first.size(0) == rows;
      m.cu_seqlens = at::cat({first, at::full({1}, m.tokens, first.options())}).to(at::kInt);
      m.max_document = (m.cu_seqlens.narrow(0, 1, first.size(0)) - m.cu_seqlens.narrow(0, 0, first.size(0))).max().item<int64_t>();
    } else {
      m.cu_seqlens = at::arange(0, m.tokens + 1, s, batch.ids.options().dtype(at::kInt));
      m.max_document = s;
    }
  }

  DecoderOutputs out;
  // Outputs are allocated here, on the caller's stream, and filled per micro-batch.
  for (int64_t i : wanted) out.layers[i] = at::empty({b, s, h}, embed_.options());
  if (want_last_hidden) out.last_hidden = at::empty({b, s, h}, embed_.options());
  at::Tensor x = embed_.index_select(0, batch.ids.flatten());  // [N, H], the residual stream
  fast_path::interleave_on_streams(x.device(), groups, c.num_layers + 1, [&](int64_t g, int64_t step) {
    const MicroBatch& m = micro[g];
    at::Tensor xg = x.narrow(0, m.first_token, m.tokens);
    auto slice = [&](const at::Tensor& full) { return full.view({n, h}).narrow(0, m.first_token, m.tokens); };
    if (step == c.num_layers) {
      if (want_last_hidden) slice(out.last_hidden).copy_(kernel_ops::rms_norm(xg, final_norm_, c.rms_norm_eps));
      return;
    }
    const LayerWeights& w = layers_[step];
    const at::Tensor qkv = at::linear(kernel_ops::rms_norm(xg, w.input_norm, c.rms_norm_eps), w.qkv, w.qkv_bias);
    const auto t = kernel_ops::qk_norm_rope(qkv, w.q_norm, w.k_norm, cos.narrow(0, m.first_token, m.tokens),
                                            sin.narrow(0, m.first_token, m.tokens), heads, kv_heads, hd, c.rms_norm_eps);
    const at::Tensor attention =
        cudnn_attention_ && m.one_document_per_row
            ? fast_path::row_causal_attention_cudnn(t.q, t.k, t.v, m.rows)
            : fast_path::document_causal_attention(t.q, t.k, t.v, m.cu_seqlens, m.max_document).view({m.tokens, heads * hd});
    xg.addmm_(attention, w.o.t());  // the residual add inside the GEMM
    // In place into this micro-batch's rows of x (its outputs are copies).
    // A sparse layer's routing waits for the device (hf::moe_forward reads
    // the experts' token counts), which holds up the other streams' queueing.
    bool xg_is_returned = false;
    add_mlp(c, w, xg, xg_is_returned, /*kernels=*/true, /*invariant=*/false);
    if (wanted.count(step)) slice(out.layers[step]).copy_(xg);
  });
  return out;
}

DecodeSessions Decoder::new_sessions() const {
  DecodeSessions sessions(config_.num_layers, config_.num_kv_heads, config_.head_dim, embed_.options());
  // Graphs read the pool's addresses: keep it between sequences.
  if (decode_graphs_) sessions.set_keep_when_empty(true, config_.max_position_embeddings);
  return sessions;
}

// Incremental decoding's state beyond the caches: the rotary tables, and the
// CUDA graphs of single-session steps with their static inputs and outputs.
struct Decoder::DecodeState {
  explicit DecodeState(const c10::Device& device) : graphs(device) {}
  // cos/sin of positions [0, rotary_positions): fp32 [P, hd/2] (kernel path)
  // or [P, 1, hd] in the activations' dtype (ATen path), from the same fp64
  // angles the forward forms, so a lookup gives the forward's values exactly.
  at::Tensor cos, sin;
  int64_t rotary_positions = 0;
  uint64_t rotary_generation = 0;

  // One step shape: its token count, the layers it returns, its logits, and
  // for a draft tree the stride of its node paths (0: a chain).
  using GraphKey = std::tuple<int64_t, std::vector<int64_t>, int, int64_t>;
  struct Graph : decode_support::GraphedStep {
    at::Tensor tokens, params;  // static inputs: [n] int64, [1, 2] int64 (row, length)
    // A tree's static inputs: positions [n] int64, paths [n, stride] and lengths [n] int32.
    at::Tensor tree_positions, tree_rows, tree_lengths;
    DecoderOutputs out;         // static outputs, in the graphs' memory pool
  };
  decode_support::CudaGraphPool graphs;
  std::map<GraphKey, Graph> by_shape;
  // The pool and table generations the graphs were captured against.
  std::pair<uint64_t, uint64_t> captured_against{~uint64_t{0}, ~uint64_t{0}};
  GraphStats stats;
};

Decoder::~Decoder() = default;

const Decoder::GraphStats& Decoder::decode_graph_stats() const { return decode_->stats; }

// Where a decoding step puts its tokens, checked before anything changes.
struct Decoder::StepPlan {
  std::vector<DecodeSessions::Session*> sessions;  // row i of the tokens goes to sessions[i]
  int64_t count = 0, n = 0;
  int64_t keys = 0;               // the longest session after the step: the attention's key length
  bool consecutive_rows = false;  // the sessions' pool rows are r, r + 1, …: a view, no gather
  bool equal_lengths = false;     // every session sees every key (no mask for one token each)
  bool fresh_prompt = false;      // one session, empty before the step: plain causal attention
  // A draft tree (verify_tree): the nodes' positions [n] on the device, and
  // either the additive mask [1, 1, n, keys] (the ATen step) or, in exact
  // decoding, each node's path as session rows [n, depth] and its length [n]
  // (int32, for the row-invariant attention); undefined for a chain.
  at::Tensor tree_positions, tree_mask, tree_rows, tree_lengths;
};

namespace {

// Graph only steps that recur: one session's generation (1 token) and
// verification (a drafted block); a prefill of this many tokens or fewer is
// captured only if the same length comes again.
constexpr int64_t kMaxGraphTokens = 64;
constexpr size_t kMaxGraphs = 96;
// Draft trees (verify_tree) of up to this many nodes are graphed too.
constexpr int64_t kMaxGraphTreeNodes = 1024;

}  // namespace

namespace {

// Causal attention of a step's queries over their own sessions' caches.
// q [count·n, heads, hd]; keys, values [count, kv_heads, L, hd], read where
// they lie in the pool; mask additive, or none when every key is visible.
// One token per session (generation): the query heads that share a KV head
// are that head's query rows, so the cache is read once per KV head, never
// repeated per query head. Several tokens (a prompt, a verified block): the
// keys and values are repeated per head, as the reference forward does.
at::Tensor cached_attention(const DecoderConfig& c, const at::Tensor& q, at::Tensor keys, at::Tensor values,
                            const c10::optional<at::Tensor>& mask, bool causal, int64_t count, int64_t n) {
  const int64_t heads = c.num_heads, kv_heads = c.num_kv_heads, hd = c.head_dim, group = heads / kv_heads;
  if (n == 1)
    return compat::scaled_dot_product_attention(q.view({count, kv_heads, group, hd}), keys, values, mask, false)
        .reshape({count, heads * hd});
  if (group > 1) {
    keys = keys.repeat_interleave(group, 1);
    values = values.repeat_interleave(group, 1);
  }
  return compat::scaled_dot_product_attention(q.view({count, n, heads, hd}).transpose(1, 2), keys, values, mask, causal)
      .transpose(1, 2)
      .reshape({count * n, heads * hd});
}

}  // namespace

void Decoder::ensure_rotary_tables(int64_t positions) const {
  DecodeState& d = *decode_;
  if (positions <= d.rotary_positions) return;
  const at::Tensor angles = at::arange(positions, inv_freq_.options()).unsqueeze(-1) * inv_freq_;  // [P, hd/2], fp64
  const Rotary r = rotary(angles, embed_.scalar_type(), cuda_kernels_);
  d.cos = r.cos;
  d.sin = r.sin;
  d.rotary_positions = positions;
  ++d.rotary_generation;
}

DecoderOutputs Decoder::decode_step(DecodeSessions& pool, const StepPlan& plan, const at::Tensor& tokens,
                                    const at::Tensor& params, const std::set<int64_t>& wanted, LogitRows logit_rows,
                                    bool flash) const {
  const DecoderConfig& c = config_;
  const int64_t count = plan.count, n = plan.n, tokens_in_step = count * n;
  const int64_t capacity = pool.row_capacity(), pool_rows = pool.rows();
  const int64_t kv_heads = c.num_kv_heads, hd = c.head_dim;
  // Token t of session i goes to its pool row, at position length + t: its
  // slot in the pool flattened to [rows · capacity, kv_heads, hd].
  const at::Tensor row = params.select(1, 0), length = params.select(1, 1);
  const at::Tensor offsets = at::arange(n, params.options()).unsqueeze(0);
  const at::Tensor positions =
      plan.tree_positions.defined() ? plan.tree_positions : (length.unsqueeze(1) + offsets).reshape({tokens_in_step});
  const at::Tensor slots = (row.unsqueeze(1) * capacity + length.unsqueeze(1) + offsets).reshape({tokens_in_step});
  // The kernel path picks its rotary rows and writes the cache inside one
  // kernel (qk_norm_rope_into_cache); the ATen path gathers the rows here.
  const Rotary r = cuda_kernels_ ? Rotary{}
                                 : Rotary{decode_->cos.index_select(0, positions), decode_->sin.index_select(0, positions)};

  at::Tensor cu_q, cu_k, seqused_k;  // flash: where each session's queries and keys lie, and its key count
  c10::optional<at::Tensor> mask;    // otherwise: query t of row i sees keys [0, length_i + t]
  at::Tensor gather_rows;
  if (flash) {
    cu_q = at::arange(0, tokens_in_step + 1, n, params.options()).to(at::kInt);
    cu_k = at::cat({row * capacity, at::full({1}, pool_rows * capacity, params.options())}).to(at::kInt);
    seqused_k = (length + n).to(at::kInt);
  } else if (plan.tree_mask.defined()) {
    mask = plan.tree_mask;
  } else {
    if (!(n == 1 && plan.equal_lengths) && !(n > 1 && plan.fresh_prompt)) {
      mask = at::zeros({count, 1, n, plan.keys}, embed_.options())
                 .masked_fill_(at::arange(plan.keys, params.options()).view({1, 1, 1, plan.keys}).gt(positions.view({count, 1, n, 1})),
                               -std::numeric_limits<float>::infinity());
    }
    if (!plan.consecutive_rows) gather_rows = row.contiguous();
  }
  auto gather = [&](const at::Tensor& layer_pool) {  // [count, kv_heads, keys, hd]
    const at::Tensor mine = plan.consecutive_rows ? layer_pool.narrow(0, plan.sessions[0]->row, count)
                                                  : layer_pool.index_select(0, gather_rows);
    return mine.narrow(1, 0, plan.keys).transpose(1, 2);
  };

  // Exact decoding: a step of up to kInvariantMaxRows (16) tokens, or a draft
  // tree of any size, runs the row-invariant kernels, so each token's numbers
  // are those it gets alone (past the attention's shared-memory bound,
  // exact_decoding: auto takes the usual kernels; `on` was refused in extend).
  const bool exact = exact_decoding_ && flash &&
                     (tokens_in_step <= kernel_ops::kInvariantMaxRows || plan.tree_rows.defined()) &&
                     kernel_ops::invariant_decode_attention_fits(hd, capacity);
  DecoderOutputs out;
  at::Tensor x = embed_.index_select(0, tokens);  // [count·n, H]
  bool x_is_returned = false;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LayerWeights& w = layers_[i];
    const at::Tensor keys = pool.keys(i).view({pool_rows * capacity, kv_heads, hd});
    const at::Tensor values = pool.values(i).view({pool_rows * capacity, kv_heads, hd});
    at::Tensor q;
    if (cuda_kernels_) {
      const at::Tensor qkv = kernel_ops::linear(norm(c, x, w.input_norm, true), w.qkv, w.qkv_bias, exact);
      q = kernel_ops::qk_norm_rope_into_cache(qkv, w.q_norm, w.k_norm, decode_->cos, decode_->sin, positions, keys, values,
                                              slots, c.num_heads, kv_heads, hd, c.rms_norm_eps);
    } else {
      const QKV t = project_qkv(c, w, x, r);
      keys.index_copy_(0, slots, t.k);
      values.index_copy_(0, slots, t.v);
      q = t.q;
    }
    at::Tensor attention;
    if (exact)
      attention = kernel_ops::invariant_decode_attention(q, keys, values, cu_k, seqused_k, n, capacity, plan.tree_rows,
                                                         plan.tree_lengths);
    else if (flash) attention = fast_path::decode_attention(q, keys, values, cu_q, cu_k, seqused_k, n, capacity);
    else attention = cached_attention(c, q, gather(pool.keys(i)), gather(pool.values(i)), mask, n > 1 && plan.fresh_prompt,
                                      count, n);
    x = finish_layer(c, w, x, attention, x_is_returned, cuda_kernels_, exact);
    if (wanted.count(i)) {
      out.layers[i] = x.view({count, n, c.hidden_size});
      x_is_returned = true;
    }
  }
  if (logit_rows == LogitRows::kAll)
    out.logits = kernel_ops::linear(norm(c, x, final_norm_, cuda_kernels_), lm_head_, {}, exact).view({count, n, c.vocab_size});
  if (logit_rows == LogitRows::kLast) {
    const at::Tensor last = x.view({count, n, c.hidden_size}).select(1, n - 1);
    out.logits = kernel_ops::linear(norm(c, last, final_norm_, cuda_kernels_), lm_head_, {}, exact).unsqueeze(1);
  }
  return out;
}

bool Decoder::decode_step_graphed(DecodeSessions& pool, const StepPlan& plan, const at::Tensor& tokens,
                                  const std::vector<int64_t>& params, const std::vector<int64_t>& layer_ids,
                                  const std::set<int64_t>& wanted, LogitRows logit_rows, DecoderOutputs& result) const {
  DecodeState& d = *decode_;
  const std::pair<uint64_t, uint64_t> against{pool.generation(), d.rotary_generation};
  if (against != d.captured_against) {  // the pool or the tables moved: every graph reads stale addresses
    d.by_shape.clear();
    d.graphs.renew();
    d.captured_against = against;
  }
  const bool tree = plan.tree_rows.defined();
  const auto key = DecodeState::GraphKey{plan.n, layer_ids, static_cast<int>(logit_rows), tree ? plan.tree_rows.size(1) : 0};
  auto found = d.by_shape.find(key);
  if (found == d.by_shape.end()) {
    if (d.by_shape.size() >= kMaxGraphs) return false;
    found = d.by_shape.emplace(key, DecodeState::Graph{}).first;
  }
  DecodeState::Graph& g = found->second;
  if (!g.take()) return false;  // the first use of a shape runs eagerly
  const auto device = embed_.device();
  if (!g.graph) {
    g.tokens = at::empty({plan.n}, at::TensorOptions().dtype(at::kLong).device(device));
    g.params = at::empty({1, 2}, at::TensorOptions().dtype(at::kLong).device(device));
    if (tree) {
      g.tree_positions = at::empty_like(plan.tree_positions);
      g.tree_rows = at::empty_like(plan.tree_rows);
      g.tree_lengths = at::empty_like(plan.tree_lengths);
    }
  }
  // This step's inputs into the static buffers (asynchronous copies).
  if (tokens.device() == device) g.tokens.copy_(tokens.reshape({plan.n}));
  else g.tokens.copy_(decode_support::ids_on(tokens.reshape({plan.n}), device));
  g.params.copy_(decode_support::host_staging(params, device).view({1, 2}), /*non_blocking=*/true);
  StepPlan replayed = plan;  // the step as captured: a tree's inputs from the static buffers
  if (tree) {
    g.tree_positions.copy_(plan.tree_positions);
    g.tree_rows.copy_(plan.tree_rows);
    g.tree_lengths.copy_(plan.tree_lengths);
    replayed.tree_positions = g.tree_positions;
    replayed.tree_rows = g.tree_rows;
    replayed.tree_lengths = g.tree_lengths;
  }
  if (!d.graphs.replay(g, d.stats, [&] {
        g.out = decode_step(pool, replayed, g.tokens, g.params, wanted, logit_rows, /*flash=*/true);
      })) {
    // The warm-up ran the step (or failed before writing anything); running
    // it again eagerly writes the same keys and values.
    g.out = DecoderOutputs{};
    return false;
  }
  // The outputs live in the graphs' pool, which the next replay reuses: the
  // caller gets its own copies.
  result = DecoderOutputs{};
  for (const auto& [layer, tensor] : g.out.layers) result.layers[layer] = tensor.clone();
  if (g.out.logits.defined()) result.logits = g.out.logits.clone();
  return true;
}

DecoderOutputs Decoder::extend(DecodeSessions& pool, const std::vector<int64_t>& ids, const at::Tensor& tokens,
                               const std::vector<int64_t>& layer_ids, LogitRows logit_rows) const {
  const c10::NoGradGuard no_grad;
  const DecoderConfig& c = config_;
  const auto device = embed_.device();
  StepPlan plan;
  plan.count = static_cast<int64_t>(ids.size());
  if (plan.count < 1 || tokens.dim() != 2 || tokens.size(0) != plan.count || tokens.size(1) < 1)
    throw std::invalid_argument("decode_extend: tokens must be [sessions, n] with n >= 1; got " + c10::str(tokens.sizes()) +
                                " for " + std::to_string(ids.size()) + " sessions");
  plan.n = tokens.size(1);
  std::set<int64_t> seen;
  for (int64_t id : ids) {
    if (!seen.insert(id).second)
      throw std::invalid_argument("decode_extend_batch: session " + std::to_string(id) + " appears twice in one step");
    DecodeSessions::Session& s = pool.at(id);
    if (s.length + plan.n > s.capacity)
      throw std::invalid_argument("decode_extend: session " + std::to_string(id) + ": " + std::to_string(plan.n) +
                                  " more tokens would make " + std::to_string(s.length + plan.n) +
                                  ", beyond the session's max_length " + std::to_string(s.capacity));
    plan.sessions.push_back(&s);
    plan.keys = std::max(plan.keys, s.length + plan.n);
  }
  // Ids on the CPU are checked there (no device sync); ids on the device are
  // the caller's to keep in range (the header says why).
  if (tokens.device().is_cpu()) {
    const auto [low, high] = at::aminmax(tokens);
    if (low.item<int64_t>() < 0 || high.item<int64_t>() >= c.vocab_size)
      throw std::invalid_argument("decode_extend: token ids outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  }
  plan.consecutive_rows = plan.equal_lengths = true;
  for (int64_t i = 0; i < plan.count; ++i) {
    plan.consecutive_rows &= plan.sessions[i]->row == plan.sessions[0]->row + i;
    plan.equal_lengths &= plan.sessions[i]->length == plan.sessions[0]->length;
  }
  plan.fresh_prompt = plan.count == 1 && plan.sessions[0]->length == 0;
  hf::check_layer_ids(layer_ids, c.num_layers);
  const std::set<int64_t> wanted(layer_ids.begin(), layer_ids.end());

  ensure_rotary_tables(pool.row_capacity());  // every position a session of the pool can reach
  std::vector<int64_t> params;  // (pool row, cached length) per session: the step's one upload
  for (const DecodeSessions::Session* s : plan.sessions) {
    params.push_back(s->row);
    params.push_back(s->length);
  }
  const bool flash = flash_decoding_ && pool.offsets_fit_int32();
  if (exact_required_ && !kernel_ops::invariant_decode_attention_fits(c.head_dim, pool.row_capacity()))
    throw std::invalid_argument(decode_support::exact_decoding_capacity_refusal("decode_extend", pool.row_capacity()));
  DecoderOutputs out;
  const bool graphed = decode_graphs_ && flash && plan.count == 1 && plan.n <= kMaxGraphTokens &&
                       decode_step_graphed(pool, plan, tokens, params, layer_ids, wanted, logit_rows, out);
  if (!graphed)
    out = decode_step(pool, plan, decode_support::ids_on(tokens.reshape({plan.count * plan.n}), device),
                      decode_support::upload(params, device).view({plan.count, 2}), wanted, logit_rows, flash);
  // Only now: a call that threw above changed no session (rows past a
  // session's length are not part of it).
  for (DecodeSessions::Session* s : plan.sessions) s->length += plan.n;
  return out;
}

DecoderOutputs Decoder::verify_tree(DecodeSessions& pool, int64_t id, const at::Tensor& tokens_in,
                                    const std::vector<int64_t>& parents, const std::vector<int64_t>& layer_ids,
                                    bool want_logits) const {
  const c10::NoGradGuard no_grad;
  const DecoderConfig& c = config_;
  const auto device = embed_.device();
  const int64_t n = static_cast<int64_t>(parents.size());
  DecodeSessions::Session& s = pool.at(id);
  const std::vector<int64_t> depths = decode_support::checked_tree_depths(id, tokens_in.numel(), parents, s.length, s.capacity);
  const at::Tensor tokens = tokens_in.reshape({n});
  if (tokens.device().is_cpu()) {
    const auto [low, high] = at::aminmax(tokens);
    if (low.item<int64_t>() < 0 || high.item<int64_t>() >= c.vocab_size)
      throw std::invalid_argument("decode_verify_tree: token ids outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  }
  hf::check_layer_ids(layer_ids, c.num_layers);
  const std::set<int64_t> wanted(layer_ids.begin(), layer_ids.end());
  pool.reserve_row_capacity(s.length + n);  // the nodes' rows, in node order (positions come from depths)
  ensure_rotary_tables(pool.row_capacity());

  StepPlan plan;
  plan.sessions = {&s};
  plan.count = 1;
  plan.n = n;
  plan.keys = s.length + n;
  plan.consecutive_rows = plan.equal_lengths = true;
  // Positions by depth.
  std::vector<int64_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = s.length + depths[static_cast<size_t>(i)] - 1;
  plan.tree_positions = decode_support::upload(positions, device);
  // Exact decoding: the row-invariant kernels with each node's path, so a
  // node on the accepted path gets the numbers its token gets decoded alone
  // after that path (lossless in bf16). Otherwise the ATen step with a mask.
  const bool flash = flash_decoding_ && pool.offsets_fit_int32();
  const bool exact_fits = kernel_ops::invariant_decode_attention_fits(c.head_dim, pool.row_capacity());
  if (exact_required_ && !exact_fits)
    throw std::invalid_argument(decode_support::exact_decoding_capacity_refusal("decode_verify_tree", pool.row_capacity()));
  const bool exact = exact_decoding_ && flash && exact_fits;
  if (exact) {
    const decode_support::TreePathRows paths = decode_support::tree_path_rows(parents, depths, s.length);
    plan.tree_rows = decode_support::on_device(at::tensor(paths.rows, at::kInt).view({n, paths.stride}), device);
    plan.tree_lengths = decode_support::on_device(at::tensor(paths.lengths, at::kInt), device);
  } else {
    // The mask: every cached key, then node i's ancestors and itself.
    at::Tensor visible = at::zeros({n, plan.keys}, at::kBool);
    visible.narrow(1, 0, s.length).fill_(true);
    auto* v = visible.data_ptr<bool>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t a = i; a >= 0; a = parents[static_cast<size_t>(a)]) v[i * plan.keys + s.length + a] = true;
    plan.tree_mask = at::zeros({1, 1, n, plan.keys}, embed_.options())
                         .masked_fill_(decode_support::on_device(visible, device).logical_not().view({1, 1, n, plan.keys}),
                                       -std::numeric_limits<float>::infinity());
  }
  const LogitRows logit_rows = want_logits ? LogitRows::kAll : LogitRows::kNone;
  DecoderOutputs out;
  // An exact tree step replays a CUDA graph from a node count's second use on
  // (the budget keeps it mostly the same from step to step).
  const bool graphed = exact && decode_graphs_ && n <= kMaxGraphTreeNodes &&
                       decode_step_graphed(pool, plan, tokens, {s.row, s.length}, layer_ids, wanted, logit_rows, out);
  if (!graphed)
    out = decode_step(pool, plan, decode_support::ids_on(tokens, device),
                      decode_support::upload({s.row, s.length}, device).view({1, 2}), wanted, logit_rows, /*flash=*/exact);
  s.length += n;  // the rows hold the tree until accept_path (a pool growth keeps them)
  return out;
}

void Decoder::accept_path(DecodeSessions& pool, int64_t id, int64_t tree_start, const std::vector<int64_t>& path) const {
  const c10::NoGradGuard no_grad;
  pool.keep_path(id, tree_start, path);
  pool.at(id).length = tree_start + static_cast<int64_t>(path.size());
}

// The reference path (any device and dtype): ATen operations, Hugging Face's
// arithmetic step by step.
DecoderOutputs Decoder::forward_reference(const PackedBatch& batch, const std::set<int64_t>& wanted,
                                          bool want_last_hidden) const {
  const DecoderConfig& c = config_;
  const at::Tensor& ids = batch.ids;
  const int64_t b = ids.size(0), s = ids.size(1), n = b * s;
  const int64_t heads = c.num_heads, kv_heads = c.num_kv_heads, hd = c.head_dim;
  const Rotary r = rotary(batch.angles, embed_.scalar_type(), /*kernels=*/false);
  // Rows of several documents need an additive [B, 1, S, S] mask.
  const c10::optional<at::Tensor> mask = hf::document_causal_mask(batch, embed_.options());

  DecoderOutputs out;
  at::Tensor x = embed_.index_select(0, ids.flatten());  // [N, H], the residual stream
  bool x_is_returned = false;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LayerWeights& w = layers_[i];
    const QKV t = project_qkv(c, w, x, r);
    const at::Tensor q = t.q.reshape({b, s, heads, hd}).transpose(1, 2);  // [B, heads, S, hd]
    at::Tensor k = t.k.reshape({b, s, kv_heads, hd}).transpose(1, 2);
    at::Tensor v = t.v.reshape({b, s, kv_heads, hd}).transpose(1, 2);
    if (heads > kv_heads) {
      k = k.repeat_interleave(heads / kv_heads, 1);
      v = v.repeat_interleave(heads / kv_heads, 1);
    }
    const at::Tensor attention = compat::scaled_dot_product_attention(q, k, v, mask, /*is_causal=*/!mask.has_value())
                                     .transpose(1, 2)
                                     .reshape({n, heads * hd});
    x = finish_layer(c, w, x, attention, x_is_returned);
    if (wanted.count(i)) {
      out.layers[i] = x.view({b, s, c.hidden_size});
      x_is_returned = true;
    }
  }
  if (want_last_hidden) out.last_hidden = rms_norm(x, final_norm_, c.rms_norm_eps).view({b, s, c.hidden_size});
  return out;
}

}  // namespace dflash::target
