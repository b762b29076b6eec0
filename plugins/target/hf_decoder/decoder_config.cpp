#include "decoder_config.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <stdexcept>

namespace dflash::target {
namespace {

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& key, const std::string& problem) {
  throw std::runtime_error(file.string() + ": " + key + ": " + problem);
}

// The largest sizes accepted, far above any released model (hidden 16 384,
// vocabulary 256 000, 128 layers): within them every product the plugin and
// the memory planner form (layers x intermediate x hidden x bytes, tokens x
// vocabulary, ...) stays inside int64, where 10^12 wrapped to "0 B".
constexpr int64_t kMaxWidth = int64_t{1} << 20;       // hidden_size, head_dim x heads
constexpr int64_t kMaxIntermediate = int64_t{1} << 22;
constexpr int64_t kMaxLayers = int64_t{1} << 14;      // layers, heads
constexpr int64_t kMaxVocabulary = int64_t{1} << 26;
constexpr int64_t kMaxPositions = int64_t{1} << 32;

// A positive integer up to `most` (JSON integers above int64 are refused
// too: nlohmann keeps them unsigned, and reading one as int64_t wraps).
int64_t positive_int(const nlohmann::json& j, const std::filesystem::path& file, const std::string& key, int64_t most) {
  if (!j.contains(key)) fail(file, key, "missing");
  const nlohmann::json& v = j[key];
  const bool fits = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX});
  if (!fits || v.get<int64_t>() <= 0) fail(file, key, "must be a positive integer, got " + v.dump());
  if (v.get<int64_t>() > most)
    fail(file, key, v.dump() + " is larger than " + std::to_string(most) +
                        ", the most this plugin supports (sizes beyond it overflow its 64-bit memory arithmetic)");
  return v.get<int64_t>();
}

double positive_number(const nlohmann::json& j, const std::filesystem::path& file, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number() || j[key].get<double>() <= 0) fail(file, key, "must be a positive number, got " + j[key].dump());
  return j[key].get<double>();
}

}  // namespace

DecoderConfig read_decoder_config(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error(file.string() + ": cannot open; a Hugging Face model directory needs a config.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(file.string() + ": not valid JSON (" + e.what() + ")");
  }
  DecoderConfig c;
  if (!j.contains("model_type") || !j["model_type"].is_string()) fail(file, "model_type", "missing");
  c.model_type = j["model_type"].get<std::string>();
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "qwen3" && c.model_type != "mistral")
    fail(file, "model_type", "'" + c.model_type + "' is not supported (llama, mistral, qwen2, qwen3)");
  c.qk_norm = c.model_type == "qwen3";
  c.hidden_size = positive_int(j, file, "hidden_size", kMaxWidth);
  c.intermediate_size = positive_int(j, file, "intermediate_size", kMaxIntermediate);
  c.num_layers = positive_int(j, file, "num_hidden_layers", kMaxLayers);
  c.num_heads = positive_int(j, file, "num_attention_heads", kMaxLayers);
  c.num_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                       ? positive_int(j, file, "num_key_value_heads", kMaxLayers)
                       : c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0)
    fail(file, "num_key_value_heads", std::to_string(c.num_kv_heads) + " does not divide num_attention_heads " +
                                          std::to_string(c.num_heads));
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? positive_int(j, file, "head_dim", kMaxWidth)
                                                                   : c.hidden_size / c.num_heads;
  if (c.head_dim % 2 != 0) fail(file, "head_dim", "must be even for rotary embeddings");
  if (c.head_dim * c.num_heads > kMaxWidth)
    fail(file, "head_dim", std::to_string(c.head_dim) + " x " + std::to_string(c.num_heads) +
                               " heads is larger than " + std::to_string(kMaxWidth) +
                               ", the most this plugin supports (sizes beyond it overflow its 64-bit memory arithmetic)");
  c.vocab_size = positive_int(j, file, "vocab_size", kMaxVocabulary);
  c.rms_norm_eps = positive_number(j, file, "rms_norm_eps", 1e-6);
  c.rope_theta = positive_number(j, file, "rope_theta", 10000.0);
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  // eos_token_id: an id, a list of ids, or null/absent.
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const auto& e = j["eos_token_id"];
    auto id = [&](const nlohmann::json& v) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.vocab_size)
        fail(file, "eos_token_id", "must be token ids in [0, vocab_size), got " + e.dump());
      return v.get<int64_t>();
    };
    if (e.is_array())
      for (const auto& v : e) c.eos_token_ids.push_back(id(v));
    else
      c.eos_token_ids.push_back(id(e));
  }
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int64_t>();
  if (j.contains("max_position_embeddings") && !j["max_position_embeddings"].is_null())
    c.max_position_embeddings = positive_int(j, file, "max_position_embeddings", kMaxPositions);
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) c.torch_dtype = j["torch_dtype"].get<std::string>();
  else if (j.contains("dtype") && j["dtype"].is_string()) c.torch_dtype = j["dtype"].get<std::string>();
  // transformers < 5 writes rope_theta + rope_scaling; 5.x one rope_parameters
  // object holding both.
  const char* rope_key = j.contains("rope_parameters") && !j["rope_parameters"].is_null() ? "rope_parameters" : "rope_scaling";
  if (std::string(rope_key) == "rope_parameters" && j[rope_key].is_object())
    c.rope_theta = positive_number(j[rope_key], file, "rope_theta", c.rope_theta);
  if (j.contains(rope_key) && !j[rope_key].is_null()) {
    const auto& r = j[rope_key];
    if (!r.is_object()) fail(file, rope_key, "must be an object or null");
    c.rope_scaling.type = r.value("rope_type", r.value("type", std::string("default")));
    if (c.rope_scaling.type == "llama3") {
      c.rope_scaling.factor = positive_number(r, file, "factor", 1.0);
      c.rope_scaling.low_freq_factor = positive_number(r, file, "low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = positive_number(r, file, "high_freq_factor", 4.0);
      if (!r.contains("original_max_position_embeddings"))
        fail(file, std::string(rope_key) + ".original_max_position_embeddings", "missing (required by llama3 scaling)");
      c.rope_scaling.original_max_position_embeddings =
          positive_int(r, file, "original_max_position_embeddings", kMaxPositions);
    } else if (c.rope_scaling.type != "default") {
      fail(file, std::string(rope_key) + ".rope_type", "'" + c.rope_scaling.type + "' is not supported (default, llama3)");
    }
  }
  return c;
}

}  // namespace dflash::target
