#include "hybrid_config.h"

#include <algorithm>
#include <stdexcept>

namespace dflash::target {

int64_t HybridConfig::count(Mixer m) const {
  return static_cast<int64_t>(std::count(layer_types.begin(), layer_types.end(), m));
}

HybridConfig read_hybrid_config(const std::filesystem::path& file) {
  const nlohmann::json root = hf::read_json_file(file, "a Hugging Face model directory needs a config.json");
  const hf::ConfigObject top(root, file, "");
  const std::string outer = top.string("model_type", "");
  if (outer.empty()) top.fail("model_type", "missing");
  const bool multimodal = outer == "qwen3_5" || outer == "qwen3_5_moe";
  if (!multimodal && outer != "qwen3_5_text" && outer != "qwen3_5_moe_text") {
    const bool dense = outer == "llama" || outer == "mistral" || outer == "qwen2" || outer == "qwen3" || outer == "qwen3_moe";
    top.fail("model_type", "'" + outer + "' is not a Qwen3.5-family model (qwen3_5, qwen3_5_moe, qwen3_5_text, qwen3_5_moe_text)" +
                               (dense ? "; it is served by the hf_decoder target plugin (target.plugin: hf_decoder)" : ""));
  }
  if (multimodal && !(root.contains("text_config") && root["text_config"].is_object()))
    top.fail("text_config", "missing: a '" + outer + "' config.json holds the text model under text_config");
  const nlohmann::json& text_json = multimodal ? root["text_config"] : root;
  const hf::ConfigObject t(text_json, file, multimodal ? "text_config." : "");

  HybridConfig c;
  const bool moe_family = outer == "qwen3_5_moe" || outer == "qwen3_5_moe_text";
  c.model_type = moe_family ? "qwen3_5_moe_text" : "qwen3_5_text";
  c.hidden_size = t.positive_int("hidden_size", hf::kMaxWidth);
  c.num_layers = t.positive_int("num_hidden_layers", hf::kMaxLayers);
  c.vocab_size = t.positive_int("vocab_size", hf::kMaxVocabulary);
  c.rms_norm_eps = t.positive_number("rms_norm_eps", 1e-6);
  // transformers writes tie_word_embeddings at the top of a multimodal config
  // (the text_config copy is informational); the top level decides.
  c.tie_word_embeddings = top.has("tie_word_embeddings") ? top.boolean("tie_word_embeddings", false)
                                                         : t.boolean("tie_word_embeddings", false);
  if (t.string("hidden_act", "silu") != "silu") t.fail("hidden_act", "'" + t.string("hidden_act", "") + "' is not supported (silu)");

  // layer_types, or full_attention_interval's pattern (every n-th layer full).
  if (t.has("layer_types")) {
    const auto& types = t.at("layer_types");
    if (!types.is_array()) t.fail("layer_types", "must be a list of 'linear_attention' / 'full_attention'");
    if (static_cast<int64_t>(types.size()) != c.num_layers)
      t.fail("layer_types", "has " + std::to_string(types.size()) + " entries, num_hidden_layers is " + std::to_string(c.num_layers));
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string kind = types[i].is_string() ? types[i].get<std::string>() : types[i].dump();
      if (kind == "linear_attention") c.layer_types.push_back(Mixer::kLinearAttention);
      else if (kind == "full_attention") c.layer_types.push_back(Mixer::kFullAttention);
      else
        t.fail("layer_types[" + std::to_string(i) + "]",
               "'" + kind + "' is not a layer type this plugin knows (linear_attention, full_attention)");
    }
  } else {
    const int64_t interval = t.positive_int("full_attention_interval", hf::kMaxLayers, 4);
    for (int64_t i = 0; i < c.num_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? Mixer::kFullAttention : Mixer::kLinearAttention);
  }

  c.num_heads = t.positive_int("num_attention_heads", hf::kMaxLayers);
  c.num_kv_heads = t.positive_int("num_key_value_heads", hf::kMaxLayers, c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    t.fail("num_key_value_heads", std::to_string(c.num_kv_heads) + " does not divide num_attention_heads " + std::to_string(c.num_heads));
  c.head_dim = t.positive_int("head_dim", hf::kMaxWidth, c.hidden_size / c.num_heads);
  if (c.head_dim * c.num_heads > hf::kMaxWidth) t.fail("head_dim", "head_dim x num_attention_heads is too large");
  if (t.boolean("attention_bias", false)) t.fail("attention_bias", "true is not supported (the Qwen3.5 family has none)");
  if (!t.boolean("attn_output_gate", true))
    t.fail("attn_output_gate", "false is not supported: Qwen3.5 attention gates its output (q_proj yields query and gate)");
  // Rotary: rope_parameters (transformers 5) or rope_theta / partial_rotary_factor beside it.
  double partial = t.number_in("partial_rotary_factor", 0.0, 1.0, 0.25);
  c.rope_theta = t.positive_number("rope_theta", c.rope_theta);
  if (t.has("rope_parameters")) {
    if (!t.at("rope_parameters").is_object()) t.fail("rope_parameters", "must be an object");
    const hf::ConfigObject r(t.at("rope_parameters"), file, t.key("rope_parameters."));
    c.rope_theta = r.positive_number("rope_theta", c.rope_theta);
    partial = r.number_in("partial_rotary_factor", 0.0, 1.0, partial);
    const std::string type = r.string("rope_type", r.string("type", "default"));
    if (type != "default") r.fail("rope_type", "'" + type + "' is not supported (default; text-only positions make mrope plain rotary)");
  }
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);  // int(), as transformers
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0)
    t.fail("partial_rotary_factor", std::to_string(partial) + " x head_dim " + std::to_string(c.head_dim) + " = " +
                                        std::to_string(c.rotary_dim) + " rotary dims; it must be a positive even number");

  c.linear_key_heads = t.positive_int("linear_num_key_heads", hf::kMaxLayers, 16);
  c.linear_value_heads = t.positive_int("linear_num_value_heads", hf::kMaxLayers, 32);
  if (c.linear_value_heads % c.linear_key_heads != 0)
    t.fail("linear_num_value_heads", std::to_string(c.linear_value_heads) + " is not a multiple of linear_num_key_heads " +
                                         std::to_string(c.linear_key_heads));
  c.linear_key_dim = t.positive_int("linear_key_head_dim", hf::kMaxWidth, 128);
  c.linear_value_dim = t.positive_int("linear_value_head_dim", hf::kMaxWidth, 128);
  if (c.conv_dim() > hf::kMaxWidth) t.fail("linear_num_value_heads", "the linear layers' widths are too large");
  c.conv_kernel = t.positive_int("linear_conv_kernel_dim", 64, 4);

  if (moe_family) {
    c.moe.experts = t.positive_int("num_experts", hf::kMaxLayers);
    c.moe.top_k = t.positive_int("num_experts_per_tok", hf::kMaxLayers);
    if (c.moe.top_k > c.moe.experts)
      t.fail("num_experts_per_tok", std::to_string(c.moe.top_k) + " is more than num_experts " + std::to_string(c.moe.experts));
    c.moe.intermediate = t.positive_int("moe_intermediate_size", hf::kMaxIntermediate);
    c.moe.shared_intermediate = t.positive_int("shared_expert_intermediate_size", hf::kMaxIntermediate);
    c.moe.normalize = true;  // Qwen3.5 MoE's router always renormalises its top k
  } else {
    c.intermediate_size = t.positive_int("intermediate_size", hf::kMaxIntermediate);
  }
  c.generation = hf::read_generation_facts(t, c.vocab_size);
  // A multimodal config may name the end-of-text token at its top level only.
  if (c.generation.eos_token_ids.empty() && multimodal && top.has("eos_token_id"))
    c.generation.eos_token_ids = hf::read_generation_facts(top, c.vocab_size).eos_token_ids;
  c.torch_dtype = t.string("dtype", t.string("torch_dtype", top.string("dtype", top.string("torch_dtype", "float32"))));
  return c;
}

}  // namespace dflash::target
