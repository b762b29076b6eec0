#include "export_format.h"

#include <stdexcept>
#include <string>

namespace dflash::drafter {

nlohmann::json export_config(const DrafterShape& s, const ExportFacts& f) {
  // Qwen3Config has defaults for nearly every field (Qwen3-8B's), so each one
  // the reference's modules read is written out rather than left to them.
  const nlohmann::json layer_types(static_cast<size_t>(s.layers), "full_attention");
  nlohmann::json config = {
      {"architectures", {"DFlashDraftModel"}},
      // AutoModel.from_pretrained(trust_remote_code=True) builds the class
      // from dflash.py beside config.json, as for z-lab's published drafters.
      {"auto_map", {{"AutoModel", "dflash.DFlashDraftModel"}}},
      {"model_type", "qwen3"},
      {"num_hidden_layers", s.layers},
      {"hidden_size", s.hidden},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"head_dim", s.head_dim},
      {"intermediate_size", s.intermediate},
      {"hidden_act", "silu"},
      {"rms_norm_eps", s.rms_norm_eps},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      // Every layer attends to the whole context (no sliding window).
      {"layer_types", layer_types},
      {"use_sliding_window", false},
      {"sliding_window", nullptr},
      {"max_window_layers", s.layers},
      // Plain RoPE at rope_theta: transformers before 5 reads rope_theta and
      // rope_scaling, 5 and later rope_parameters.
      {"rope_theta", s.rope_theta},
      {"rope_scaling", nullptr},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", s.rope_theta}}},
      // The rotary embedding's cache length; the reference's default is Qwen3-8B's.
      {"max_position_embeddings", f.max_position_embeddings > 0 ? f.max_position_embeddings : 32768},
      {"vocab_size", f.vocab},
      // The drafter has no embedding or lm_head of its own: it uses the target's.
      {"tie_word_embeddings", false},
      {"use_cache", true},
      {"initializer_range", f.init_std},
      // The reference evaluates its default target_layer_ids from this even
      // when dflash_config gives them: without it, loading fails.
      {"num_target_layers", f.target_layers},
      {"block_size", f.block_size},
      // Also at the top level: the host reads the drafter's facts there
      // (eval's checkpoint check, the trainer's target layers).
      {"target_layer_ids", f.layer_ids},
      {"mask_token_id", f.mask_token},
      {"dflash_config",
       {{"block_size", f.block_size}, {"target_layer_ids", f.layer_ids}, {"mask_token_id", f.mask_token},
        {"gamma", f.gamma}, {"max_anchors", f.max_anchors}}}};
  return config;
}

namespace {

const nlohmann::json& field(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) throw std::invalid_argument(std::string("config.json has no \"") + key + "\"");
  return config.at(key);
}

int64_t positive(const nlohmann::json& config, const char* key) {
  const nlohmann::json& v = field(config, key);
  if (!v.is_number_integer() || v.get<int64_t>() <= 0)
    throw std::invalid_argument(std::string("config.json: \"") + key + "\" must be a positive integer, not " + v.dump());
  return v.get<int64_t>();
}

// A DFlash field: dflash_config's, else the top level's (older builds wrote it only there).
const nlohmann::json& dflash_field(const nlohmann::json& config, const char* key) {
  if (config.contains("dflash_config") && config.at("dflash_config").is_object() && config.at("dflash_config").contains(key))
    return config.at("dflash_config").at(key);
  if (!config.contains(key))
    throw std::invalid_argument(std::string("config.json has no \"") + key + "\", in dflash_config or at the top level");
  return config.at(key);
}

}  // namespace

ExportedDrafter read_export_config(const nlohmann::json& config) {
  if (!config.is_object()) throw std::invalid_argument("config.json is not a JSON object");
  ExportedDrafter e;
  DrafterShape& s = e.shape;
  s.layers = positive(config, "num_hidden_layers");
  s.hidden = positive(config, "hidden_size");
  s.target_hidden = s.hidden;  // fc reads len(target_layer_ids) × hidden_size, as the reference sizes it
  s.heads = positive(config, "num_attention_heads");
  s.kv_heads = positive(config, "num_key_value_heads");
  s.head_dim = positive(config, "head_dim");
  s.intermediate = positive(config, "intermediate_size");
  if (s.heads % s.kv_heads != 0) throw std::invalid_argument("config.json: num_key_value_heads does not divide num_attention_heads");
  s.rms_norm_eps = field(config, "rms_norm_eps").get<double>();
  if (config.contains("rope_theta") && config.at("rope_theta").is_number()) {
    s.rope_theta = config.at("rope_theta").get<double>();
  } else if (config.contains("rope_parameters") && config.at("rope_parameters").is_object() &&
             config.at("rope_parameters").contains("rope_theta")) {
    s.rope_theta = config.at("rope_parameters").at("rope_theta").get<double>();
  } else {
    throw std::invalid_argument("config.json has no \"rope_theta\" (nor rope_parameters.rope_theta)");
  }
  const nlohmann::json& ids = dflash_field(config, "target_layer_ids");
  if (!ids.is_array() || ids.empty()) throw std::invalid_argument("config.json: target_layer_ids must be a non-empty list");
  e.layer_ids = ids.get<std::vector<int64_t>>();
  s.feature_layers = static_cast<int64_t>(e.layer_ids.size());
  e.block_size = dflash_field(config, "block_size").get<int64_t>();
  e.mask_token = dflash_field(config, "mask_token_id").get<int64_t>();
  e.target_layers = config.value("num_target_layers", int64_t{0});
  return e;
}

}  // namespace dflash::drafter
