#include "decoder_config.h"

#include <config_json.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace dflash::target {
namespace {

// transformers < 5 writes rope_theta + rope_scaling; 5.x one rope_parameters
// object holding both.
void read_rope(const hf::ConfigObject& top, DecoderConfig& c) {
  c.rope_theta = top.positive_number("rope_theta", 10000.0);
  const std::string key = top.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!top.has(key)) return;
  if (!top.at(key).is_object()) top.fail(key, "must be an object or null");
  const hf::ConfigObject r(top.at(key), top.file(), top.key(key) + ".");
  if (key == "rope_parameters") c.rope_theta = r.positive_number("rope_theta", c.rope_theta);
  c.rope_scaling.type = r.string("rope_type", r.string("type", "default"));
  if (c.rope_scaling.type == "llama3") {
    c.rope_scaling.factor = r.positive_number("factor", 1.0);
    c.rope_scaling.low_freq_factor = r.positive_number("low_freq_factor", 1.0);
    c.rope_scaling.high_freq_factor = r.positive_number("high_freq_factor", 4.0);
    if (!r.has("original_max_position_embeddings"))
      r.fail("original_max_position_embeddings", "missing (required by llama3 scaling)");
    c.rope_scaling.original_max_position_embeddings = r.positive_int("original_max_position_embeddings", hf::kMaxPositions);
  } else if (c.rope_scaling.type != "default") {
    r.fail("rope_type", "'" + c.rope_scaling.type + "' is not supported (default, llama3)");
  }
}

// Qwen3 MoE's experts, and which layers use them. transformers'
// Qwen3MoeDecoderLayer: layer i is sparse iff i is not in mlp_only_layers,
// num_experts > 0 and (i + 1) % decoder_sparse_step == 0; every other layer
// keeps the dense MLP of intermediate_size.
void read_experts(const hf::ConfigObject& top, DecoderConfig& c) {
  c.sparse_layers.assign(static_cast<size_t>(c.num_layers), false);
  if (c.model_type != "qwen3_moe") return;
  // The released checkpoints (transformers 4) say num_experts; transformers 5
  // writes it as num_local_experts.
  const bool both = top.has("num_experts") && top.has("num_local_experts");
  if (both && top.at("num_experts") != top.at("num_local_experts"))
    top.fail("num_local_experts", top.at("num_local_experts").dump() + " disagrees with num_experts " +
                                      top.at("num_experts").dump() + "; keep one of the two");
  const std::string experts_key = top.has("num_experts") || !top.has("num_local_experts") ? "num_experts" : "num_local_experts";
  if (!top.has(experts_key)) top.fail(experts_key, "missing (a qwen3_moe config.json gives its expert count)");
  const int64_t experts = top.non_negative_int(experts_key, hf::kMaxLayers, 0);
  if (experts == 0) return;  // transformers: every layer dense
  c.moe.experts = experts;
  c.moe.top_k = top.positive_int("num_experts_per_tok", hf::kMaxLayers);
  if (c.moe.top_k > experts)
    top.fail("num_experts_per_tok", std::to_string(c.moe.top_k) + " is more than " + experts_key + " " +
                                        std::to_string(experts) + ": a token cannot be routed to more experts than there are");
  c.moe.intermediate = top.positive_int("moe_intermediate_size", hf::kMaxIntermediate);
  c.moe.normalize = top.boolean("norm_topk_prob", false);  // Qwen3MoeConfig's default
  c.moe.shared_intermediate = 0;                            // qwen3_moe has no shared expert
  const int64_t step = top.positive_int("decoder_sparse_step", hf::kMaxLayers, 1);
  const std::vector<int64_t> dense = top.int_list("mlp_only_layers", c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i)
    c.sparse_layers[static_cast<size_t>(i)] = (i + 1) % step == 0 && std::find(dense.begin(), dense.end(), i) == dense.end();
}

}  // namespace

bool DecoderConfig::has_experts() const {
  return std::find(sparse_layers.begin(), sparse_layers.end(), true) != sparse_layers.end();
}

DecoderConfig read_decoder_config(const std::filesystem::path& file) {
  const nlohmann::json j = hf::read_json_file(file, "a Hugging Face model directory needs a config.json");
  const hf::ConfigObject top(j, file, "");
  DecoderConfig c;
  if (!top.has("model_type") || !top.at("model_type").is_string()) top.fail("model_type", "missing");
  c.model_type = top.string("model_type", "");
  static const char* const kFamilies[] = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe"};
  if (std::find(std::begin(kFamilies), std::end(kFamilies), c.model_type) == std::end(kFamilies))
    top.fail("model_type", "'" + c.model_type + "' is not supported (llama, mistral, qwen2, qwen3, qwen3_moe)");
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe";  // Qwen3 MoE's attention is Qwen3's
  c.hidden_size = top.positive_int("hidden_size", hf::kMaxWidth);
  c.intermediate_size = top.positive_int("intermediate_size", hf::kMaxIntermediate);
  c.num_layers = top.positive_int("num_hidden_layers", hf::kMaxLayers);
  c.num_heads = top.positive_int("num_attention_heads", hf::kMaxLayers);
  c.num_kv_heads = top.positive_int("num_key_value_heads", hf::kMaxLayers, c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    top.fail("num_key_value_heads", std::to_string(c.num_kv_heads) + " does not divide num_attention_heads " +
                                        std::to_string(c.num_heads));
  c.head_dim = top.positive_int("head_dim", hf::kMaxWidth, c.hidden_size / c.num_heads);
  if (c.head_dim % 2 != 0) top.fail("head_dim", "must be even for rotary embeddings");
  if (c.head_dim * c.num_heads > hf::kMaxWidth)
    top.fail("head_dim", std::to_string(c.head_dim) + " x " + std::to_string(c.num_heads) + " heads is larger than " +
                             std::to_string(hf::kMaxWidth) +
                             ", the most this plugin supports (sizes beyond it overflow its 64-bit memory arithmetic)");
  c.vocab_size = top.positive_int("vocab_size", hf::kMaxVocabulary);
  c.rms_norm_eps = top.positive_number("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = top.boolean("tie_word_embeddings", false);
  const hf::GenerationFacts g = hf::read_generation_facts(top, c.vocab_size);
  c.eos_token_ids = g.eos_token_ids;
  c.bos_token_id = g.bos_token_id;
  c.max_position_embeddings = g.max_position_embeddings;
  if (top.has("torch_dtype") && top.at("torch_dtype").is_string()) c.torch_dtype = top.string("torch_dtype", "");
  else if (top.has("dtype") && top.at("dtype").is_string()) c.torch_dtype = top.string("dtype", "");
  read_rope(top, c);
  read_experts(top, c);
  return c;
}

}  // namespace dflash::target
