#include "decoder.h"

#include "fast_path.h"

#include <dflash/sdk/memory_plan.hpp>
#include <dflash/sdk/safetensors_torch.hpp>
#include <dflash/sdk/torch_compat.hpp>

#include <c10/core/GradMode.h>

#include <cmath>
#include <limits>
#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>

namespace dflash::target {
namespace fs = std::filesystem;
namespace st = sdk::safetensors;

namespace {

// Every tensor of the checkpoint, by name, with the file it came from.
class Checkpoint {
 public:
  explicit Checkpoint(const fs::path& dir) {
    const fs::path single = dir / "model.safetensors";
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
      std::ifstream in(index);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(index.string() + ": not valid JSON (" + e.what() + ")");
      }
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        throw std::runtime_error(index.string() + ": weight_map: missing");
      std::map<std::string, std::shared_ptr<st::File>> shards;
      for (auto& [name, shard] : j["weight_map"].items()) {
        const std::string file = shard.get<std::string>();
        if (file.find('/') != std::string::npos || file == ".." )
          throw std::runtime_error(index.string() + ": weight_map." + name + ": shard '" + file + "' must be a file name in the model directory");
        if (!shards.count(file)) shards[file] = st::File::open(dir / file);
        if (!shards[file]->find(name))
          throw std::runtime_error((dir / file).string() + ": tensor '" + name + "' is listed in " + index.filename().string() +
                                   " but missing from the shard");
        where_[name] = shards[file];
      }
    } else if (fs::exists(single)) {
      auto file = st::File::open(single);
      for (const auto& t : file->tensors()) where_[t.name] = file;
    } else {
      throw std::runtime_error(dir.string() + ": no model.safetensors or model.safetensors.index.json");
    }
  }

  bool has(const std::string& name) const { return where_.count(name) > 0; }

  // The tensor, converted to dtype/device, checked against the expected shape.
  at::Tensor get(const std::string& name, std::vector<int64_t> shape, c10::ScalarType dtype, c10::Device device) const {
    auto it = where_.find(name);
    if (it == where_.end())
      throw std::runtime_error("checkpoint: tensor '" + name + "' is missing (" + std::to_string(where_.size()) + " tensors present)");
    at::Tensor t = st::load_tensor(it->second, name);
    if (t.sizes().vec() != shape) {
      std::string expected, got;
      for (auto d : shape) expected += (expected.empty() ? "" : ", ") + std::to_string(d);
      for (auto d : t.sizes()) got += (got.empty() ? "" : ", ") + std::to_string(d);
      throw std::runtime_error(it->second->path().string() + ": tensor '" + name + "' has shape [" + got +
                               "], config.json implies [" + expected + "]");
    }
    if (!at::isFloatingType(t.scalar_type()))
      throw std::runtime_error(it->second->path().string() + ": tensor '" + name + "' is not floating point");
    return t.to(device, dtype).contiguous();
  }

 private:
  std::map<std::string, std::shared_ptr<st::File>> where_;
};

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
  const Checkpoint ckpt(dir);  // headers only: the files are mapped, not read
  const double e = static_cast<double>(c10::elementSize(dtype));
  const double h = static_cast<double>(c.hidden_size), inter = static_cast<double>(c.intermediate_size);
  const double hd = static_cast<double>(c.head_dim), heads = static_cast<double>(c.num_heads);
  const double qkv_out = static_cast<double>(c.num_heads + 2 * c.num_kv_heads) * hd;
  const double q_out = heads * hd, vocab = static_cast<double>(c.vocab_size);
  // Exactly what the constructor keeps: embedding, final norm, lm_head unless
  // tied, and per layer two norms, qkv (+ bias), o, q/k norms, gate_up, down.
  double elements = vocab * h + h + (ckpt.has("lm_head.weight") ? vocab * h : 0.0);
  const bool bias = ckpt.has("model.layers.0.self_attn.q_proj.bias");
  const double layer = 2 * h + qkv_out * h + (bias ? qkv_out : 0.0) + h * q_out + (c.qk_norm ? 2 * hd : 0.0) + 3 * inter * h;
  elements += static_cast<double>(c.num_layers) * layer;
  m.weight_bytes = sdk::MemoryPlan::saturated_bytes(elements * e);
  m.cuda_kernels = options.cuda_kernels && device.is_cuda() && fast_path::available() &&
                   (dtype == at::kBFloat16 || dtype == at::kHalf) && c.head_dim <= 256;
  // One forward: the residual stream, the rotary tables, and the larger of a
  // layer's attention half (norm, qkv, q/k/v after RoPE, attention output)
  // and its MLP half (norm, gate_up, silu·up) — over every token, as the
  // streams' micro-batches together cover the batch.
  const double tokens = static_cast<double>(rows) * static_cast<double>(row_length);
  const double attention_half = h + 2 * qkv_out + q_out, mlp_half = h + 3 * inter;
  double bytes = tokens * e * (h + std::max(attention_half, mlp_half)) + tokens * hd * 8.0 /* fp64 angles */ +
                 tokens * hd * (m.cuda_kernels ? 4.0 : e) /* cos, sin */;
  if (!m.cuda_kernels) {
    // The ATen path: fp32 norm temporaries, K/V repeated to every head, and
    // (off CUDA) SDPA's math path with its [heads, S, S] probabilities per row.
    bytes += tokens * h * 8.0 + tokens * q_out * e * 2;
    if (!device.is_cuda()) bytes += static_cast<double>(rows) * heads * static_cast<double>(row_length) *
                                    static_cast<double>(row_length) * e * 2;
  }
  m.forward_bytes = sdk::MemoryPlan::saturated_bytes(bytes);
  return m;
}

Decoder::Decoder(const fs::path& dir, c10::ScalarType dtype, c10::Device device, const DecoderOptions& options)
    : config_(read_decoder_config(dir / "config.json")), streams_(options.streams) {
  const Checkpoint ckpt(dir);
  const DecoderConfig& c = config_;
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
    w.gate_up = at::cat({ckpt.get(p + "mlp.gate_proj.weight", {c.intermediate_size, h}, dtype, device),
                         ckpt.get(p + "mlp.up_proj.weight", {c.intermediate_size, h}, dtype, device)});
    w.down = ckpt.get(p + "mlp.down_proj.weight", {h, c.intermediate_size}, dtype, device);
    layers_.push_back(std::move(w));
  }
  inv_freq_ = rope_inverse_frequencies(c).to(device);
  cuda_kernels_ = options.cuda_kernels && fast_path::available() && fast_path::supports(embed_, hd);
  cudnn_attention_ = cuda_kernels_ && options.cudnn_attention &&
                     fast_path::cudnn_attention_works(embed_, c.num_heads, c.num_kv_heads, hd);
}

namespace {

// x + a·wᵀ as one GEMM with the residual as its C operand. In place, unless x
// is also a returned hidden state (the caller must keep it).
at::Tensor add_projection(at::Tensor& x, const at::Tensor& a, const at::Tensor& w, bool& x_is_returned) {
  if (x_is_returned) {
    x_is_returned = false;
    return at::addmm(x, a, w.t());
  }
  return x.addmm_(a, w.t());
}

// One layer's queries, keys and values on the ATen path: input RMSNorm, the
// fused qkv GEMM, Qwen3's q/k norm, RoPE. x [N, H]; cos, sin [N, 1, hd].
// q [N, heads, hd]; k, v [N, kv_heads, hd].
struct QKV {
  at::Tensor q, k, v;
};
QKV project_qkv(const DecoderConfig& c, const LayerWeights& w, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t n = x.size(0), heads = c.num_heads, kv_heads = c.num_kv_heads, hd = c.head_dim;
  const at::Tensor qkv = at::linear(rms_norm(x, w.input_norm, c.rms_norm_eps), w.qkv, w.qkv_bias);  // [N, (heads + 2 kv) hd]
  at::Tensor q = qkv.narrow(1, 0, heads * hd).reshape({n, heads, hd});
  at::Tensor k = qkv.narrow(1, heads * hd, kv_heads * hd).reshape({n, kv_heads, hd});
  const at::Tensor v = qkv.narrow(1, (heads + kv_heads) * hd, kv_heads * hd).reshape({n, kv_heads, hd});
  if (c.qk_norm) {
    q = rms_norm(q, w.q_norm, c.rms_norm_eps);
    k = rms_norm(k, w.k_norm, c.rms_norm_eps);
  }
  return {q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v};
}

// The rest of the layer after attention [N, heads·hd]: the o projection and
// the SwiGLU MLP, each added to the residual stream x (add_projection).
at::Tensor finish_layer(const DecoderConfig& c, const LayerWeights& w, at::Tensor x, const at::Tensor& attention,
                        bool& x_is_returned) {
  x = add_projection(x, attention, w.o, x_is_returned);
  const at::Tensor gate_up = at::linear(rms_norm(x, w.post_attention_norm, c.rms_norm_eps), w.gate_up);  // [N, 2 I]
  const int64_t inter = c.intermediate_size;
  return add_projection(x, at::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter), w.down, x_is_returned);
}

}  // namespace

DecoderOutputs Decoder::forward(const at::Tensor& input_ids_in, const at::Tensor& position_ids_in,
                                const at::Tensor& document_ids_in, const std::vector<int64_t>& layer_ids,
                                bool want_last_hidden, bool want_logits) const {
  const c10::NoGradGuard no_grad;
  const DecoderConfig& c = config_;
  const auto device = embed_.device();
  if (input_ids_in.dim() != 2) throw std::invalid_argument("input_ids must be [B, S]");
  const at::Tensor ids = input_ids_in.to(device, at::kLong);
  if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= c.vocab_size))
    throw std::invalid_argument("input_ids has ids outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  for (int64_t id : layer_ids)
    if (id < 0 || id >= c.num_layers)
      throw std::invalid_argument("layer id " + std::to_string(id) + " is outside [0, " + std::to_string(c.num_layers) + ")");
  const int64_t b = ids.size(0), s = ids.size(1), n = b * s;

  // Documents and positions of a packed batch.
  PackedBatch batch;
  batch.ids = ids;
  at::Tensor positions, documents;
  if (document_ids_in.defined()) documents = document_ids_in.to(device, at::kLong);
  if (position_ids_in.defined()) positions = position_ids_in.to(device, at::kLong);
  if (!documents.defined() && positions.defined()) documents = positions.eq(0).to(at::kLong).cumsum(1);
  if (documents.defined() && s > 0)
    batch.starts = at::cat({at::ones({b, 1}, ids.options().dtype(at::kBool)),
                            documents.narrow(1, 1, s - 1).ne(documents.narrow(1, 0, s - 1))}, 1);
  if (!positions.defined()) {
    if (batch.starts.defined()) {
      // Position within the document: index minus the index of its first token.
      const at::Tensor index = at::arange(s, ids.options()).expand({b, s});
      const at::Tensor start_index = std::get<0>(at::cummax(at::where(batch.starts, index, at::zeros_like(index)), 1));
      positions = index - start_index;
    } else {
      positions = at::arange(s, ids.options()).expand({b, s});
    }
  }
  batch.documents = documents;
  batch.angles = positions.reshape({n}).to(at::kDouble).unsqueeze(-1) * inv_freq_;  // [N, hd/2], fp64
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
      if (want_last_hidden) slice(out.last_hidden).copy_(fast_path::rms_norm(xg, final_norm_, c.rms_norm_eps));
      return;
    }
    const LayerWeights& w = layers_[step];
    const at::Tensor qkv = at::linear(fast_path::rms_norm(xg, w.input_norm, c.rms_norm_eps), w.qkv, w.qkv_bias);
    const auto t = fast_path::qk_norm_rope(qkv, w.q_norm, w.k_norm, cos.narrow(0, m.first_token, m.tokens),
                                           sin.narrow(0, m.first_token, m.tokens), heads, kv_heads, hd, c.rms_norm_eps);
    const at::Tensor attention =
        cudnn_attention_ && m.one_document_per_row
            ? fast_path::row_causal_attention_cudnn(t.q, t.k, t.v, m.rows)
            : fast_path::document_causal_attention(t.q, t.k, t.v, m.cu_seqlens, m.max_document).view({m.tokens, heads * hd});
    xg.addmm_(attention, w.o.t());  // the residual add inside the GEMM
    const at::Tensor gate_up = at::linear(fast_path::rms_norm(xg, w.post_attention_norm, c.rms_norm_eps), w.gate_up);
    xg.addmm_(fast_path::swiglu(gate_up), w.down.t());
    if (wanted.count(step)) slice(out.layers[step]).copy_(xg);
  });
    return out;
}

DecodeCache Decoder::new_cache(int64_t capacity) const {
  if (capacity < 1) throw std::invalid_argument("a decoding session needs room for at least one token");
  const DecoderConfig& c = config_;
  DecodeCache cache;
  cache.capacity = capacity;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    cache.keys.push_back(at::empty({capacity, c.num_kv_heads, c.head_dim}, embed_.options()));
    cache.values.push_back(at::empty({capacity, c.num_kv_heads, c.head_dim}, embed_.options()));
  }
  return cache;
}

DecoderOutputs Decoder::extend(DecodeCache& cache, const at::Tensor& tokens, const std::vector<int64_t>& layer_ids,
                               bool want_logits) const {
  const c10::NoGradGuard no_grad;
  const DecoderConfig& c = config_;
  const auto device = embed_.device();
  const int64_t n = tokens.numel(), start = cache.length, total = start + n;
  if (n < 1) throw std::invalid_argument("decode_extend: no tokens");
  if (total > cache.capacity)
    throw std::invalid_argument("decode_extend: " + std::to_string(n) + " more tokens would make " + std::to_string(total) +
                                ", beyond the session's max_length " + std::to_string(cache.capacity));
  const at::Tensor ids = tokens.reshape({n}).to(device, at::kLong);
  if (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= c.vocab_size)
    throw std::invalid_argument("decode_extend: token ids outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  for (int64_t id : layer_ids)
    if (id < 0 || id >= c.num_layers)
      throw std::invalid_argument("layer id " + std::to_string(id) + " is outside [0, " + std::to_string(c.num_layers) + ")");
  const std::set<int64_t> wanted(layer_ids.begin(), layer_ids.end());
  const int64_t heads = c.num_heads, kv_heads = c.num_kv_heads, hd = c.head_dim;
  const at::Tensor angles = at::arange(start, total, ids.options().dtype(at::kDouble)).unsqueeze(-1) * inv_freq_;
  const at::Tensor emb = at::cat({angles, angles}, -1).view({n, 1, hd});
  const at::Tensor cos = emb.cos().to(embed_.scalar_type()), sin = emb.sin().to(embed_.scalar_type());
  // New token i sees keys [0, start + i]: a mask only when several arrive at once.
  c10::optional<at::Tensor> mask;
  if (n > 1) {
    const at::Tensor allowed = at::arange(total, ids.options()).view({1, total}).le(at::arange(start, total, ids.options()).view({n, 1}));
    mask = at::zeros({1, 1, n, total}, embed_.options()).masked_fill_(allowed.logical_not().view({1, 1, n, total}),
                                                                     -std::numeric_limits<float>::infinity());
  }
  DecoderOutputs out;
  at::Tensor x = embed_.index_select(0, ids);  // [n, H]
  bool x_is_returned = false;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LayerWeights& w = layers_[i];
    const QKV t = project_qkv(c, w, x, cos, sin);
    cache.keys[i].narrow(0, start, n).copy_(t.k);
    cache.values[i].narrow(0, start, n).copy_(t.v);
    at::Tensor keys = cache.keys[i].narrow(0, 0, total).transpose(0, 1);  // [kv, total, hd]
    at::Tensor values = cache.values[i].narrow(0, 0, total).transpose(0, 1);
    if (heads > kv_heads) {
      keys = keys.repeat_interleave(heads / kv_heads, 0);
      values = values.repeat_interleave(heads / kv_heads, 0);
    }
    const at::Tensor attention =
        compat::scaled_dot_product_attention(t.q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), mask,
                                             /*is_causal=*/false)
            .squeeze(0)
            .transpose(0, 1)
            .reshape({n, heads * hd});
    x = finish_layer(c, w, x, attention, x_is_returned);
    if (wanted.count(i)) {
      out.layers[i] = x;
      x_is_returned = true;
    }
  }
  if (want_logits) out.logits = at::linear(rms_norm(x, final_norm_, c.rms_norm_eps), lm_head_);
  cache.length = total;  // only now: a call that threw above changed nothing
  return out;
}

// The reference path (any device and dtype): ATen operations, Hugging Face's
// arithmetic step by step.
DecoderOutputs Decoder::forward_reference(const PackedBatch& batch, const std::set<int64_t>& wanted,
                                          bool want_last_hidden) const {
  const DecoderConfig& c = config_;
  const at::Tensor& ids = batch.ids;
  const int64_t b = ids.size(0), s = ids.size(1), n = b * s;
  const int64_t heads = c.num_heads, kv_heads = c.num_kv_heads, hd = c.head_dim;
  const at::Tensor emb = at::cat({batch.angles, batch.angles}, -1).view({n, 1, hd});
  const at::Tensor cos = emb.cos().to(embed_.scalar_type());
  const at::Tensor sin = emb.sin().to(embed_.scalar_type());
  // Rows of several documents need an additive [B, 1, S, S] mask.
  c10::optional<at::Tensor> mask;
  const at::Tensor& documents = batch.documents;
  if (documents.defined() && !documents.eq(documents.narrow(1, 0, 1)).all().item<bool>()) {
    const at::Tensor same = documents.unsqueeze(2).eq(documents.unsqueeze(1));  // [B, S, S]
    const at::Tensor causal = at::ones({s, s}, ids.options().dtype(at::kBool)).tril();
    // Additive (0 / −inf) rather than boolean: both LibTorch versions accept it.
    const at::Tensor allowed = same.logical_and(causal).unsqueeze(1);  // [B, 1, S, S]
    mask = at::zeros(allowed.sizes(), embed_.options()).masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  }

  DecoderOutputs out;
  at::Tensor x = embed_.index_select(0, ids.flatten());  // [N, H], the residual stream
  bool x_is_returned = false;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LayerWeights& w = layers_[i];
    const QKV t = project_qkv(c, w, x, cos, sin);
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
