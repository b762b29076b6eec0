// Checked readers for a Hugging Face config.json: every error is
// "<file>: <key>: <problem>", the key spelled as the user would look for it
// (text_config.layer_types[3]).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dflash::hf {

// The largest sizes accepted, far above any released model (hidden 16 384,
// vocabulary 256 000, 128 layers, 512 experts): within them every product the
// plugins and the memory planner form (layers x experts x intermediate x
// hidden x bytes, tokens x vocabulary, ...) stays inside int64.
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden_size, head_dim x heads
constexpr int64_t kMaxIntermediate = int64_t{1} << 22;
constexpr int64_t kMaxLayers = int64_t{1} << 14;  // layers, heads, experts
constexpr int64_t kMaxVocabulary = int64_t{1} << 26;
constexpr int64_t kMaxPositions = int64_t{1} << 32;

// config.json parsed; throws naming the file when it is missing or not JSON.
nlohmann::json read_json_file(const std::filesystem::path& file, const std::string& what_it_is);

// A view of one object of config.json: `where` is its key path for errors
// ("" for the top level, "text_config." for the nested text model).
class ConfigObject {
 public:
  ConfigObject(const nlohmann::json& j, std::filesystem::path file, std::string where)
      : j_(j), file_(std::move(file)), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;
  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  const nlohmann::json& at(const std::string& key) const { return j_.at(key); }
  const nlohmann::json& json() const { return j_; }
  const std::filesystem::path& file() const { return file_; }
  std::string key(const std::string& k) const { return where_ + k; }

  // A positive integer up to `most`; required unless a fallback is given.
  int64_t positive_int(const std::string& key, int64_t most) const;
  int64_t positive_int(const std::string& key, int64_t most, int64_t fallback) const;
  int64_t non_negative_int(const std::string& key, int64_t most, int64_t fallback) const;
  double positive_number(const std::string& key, double fallback) const;
  double number_in(const std::string& key, double low, double high, double fallback) const;  // (low, high]
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  // A list of non-negative integers below `bound`.
  std::vector<int64_t> int_list(const std::string& key, int64_t bound) const;

 private:
  const nlohmann::json& j_;
  std::filesystem::path file_;
  std::string where_;
};

// The facts about decoding every family reads the same way: eos_token_id
// (an id, a list, or null), bos_token_id, max_position_embeddings.
struct GenerationFacts {
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  int64_t max_position_embeddings = 0;  // 0 = config.json does not say
};
GenerationFacts read_generation_facts(const ConfigObject& c, int64_t vocab_size);

}  // namespace dflash::hf
