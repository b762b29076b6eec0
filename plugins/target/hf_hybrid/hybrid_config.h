// What a Qwen3.5 / Qwen3.6 hybrid target needs from config.json: the dense
// (qwen3_5) and Mixture-of-Experts (qwen3_5_moe) families, either as the text
// model's own config (qwen3_5_text, qwen3_5_moe_text) or as the multimodal
// folder the checkpoints ship as (model_type qwen3_5 / qwen3_5_moe with the
// text model under text_config). Errors name the file and key.
#pragma once

#include <config_json.h>
#include <moe.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dflash::target {

// One decoder layer's token mixer, from text_config.layer_types.
enum class Mixer { kLinearAttention, kFullAttention };

struct HybridConfig {
  std::string model_type;  // the text model's: qwen3_5_text or qwen3_5_moe_text
  int64_t hidden_size = 0, num_layers = 0, vocab_size = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::vector<Mixer> layer_types;
  // Full-attention layers: GQA with q/k RMSNorm (1 + w), rotary embedding on
  // the first rotary_dim of each head, and a sigmoid gate on the output
  // (q_proj yields [query; gate] per head).
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, rotary_dim = 0;
  double rope_theta = 10000000.0;
  // Linear-attention layers (Gated DeltaNet): key heads serve
  // linear_value_heads / linear_key_heads consecutive value heads each.
  int64_t linear_key_heads = 0, linear_value_heads = 0, linear_key_dim = 0, linear_value_dim = 0;
  int64_t conv_kernel = 4;
  // The MLP: dense SwiGLU (intermediate_size), or experts (moe.experts > 0).
  int64_t intermediate_size = 0;
  hf::MoeSpec moe;
  hf::GenerationFacts generation;
  std::string torch_dtype = "float32";

  bool is_moe() const { return moe.experts > 0; }
  int64_t key_dim() const { return linear_key_heads * linear_key_dim; }      // q and k widths
  int64_t value_dim() const { return linear_value_heads * linear_value_dim; }  // v and z widths
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t count(Mixer m) const;
};

// Throws std::runtime_error "<file>: <key>: <problem>".
HybridConfig read_hybrid_config(const std::filesystem::path& config_json);

}  // namespace dflash::target
