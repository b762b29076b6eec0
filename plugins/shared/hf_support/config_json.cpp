#include "config_json.h"

#include <fstream>
#include <stdexcept>

namespace dflash::hf {

nlohmann::json read_json_file(const std::filesystem::path& file, const std::string& what_it_is) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error(file.string() + ": cannot open; " + what_it_is);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(file.string() + ": not valid JSON (" + e.what() + ")");
  }
}

void ConfigObject::fail(const std::string& key, const std::string& problem) const {
  throw std::runtime_error(file_.string() + ": " + where_ + key + ": " + problem);
}

namespace {
bool fits_int64(const nlohmann::json& v) {
  // nlohmann keeps integers above int64 unsigned; reading one as int64_t wraps.
  return v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX});
}
}  // namespace

int64_t ConfigObject::positive_int(const std::string& key, int64_t most) const {
  if (!has(key)) fail(key, "missing");
  const nlohmann::json& v = j_[key];
  if (!fits_int64(v) || v.get<int64_t>() <= 0) fail(key, "must be a positive integer, got " + v.dump());
  if (v.get<int64_t>() > most)
    fail(key, v.dump() + " is larger than " + std::to_string(most) +
                  ", the most this plugin supports (sizes beyond it overflow its 64-bit memory arithmetic)");
  return v.get<int64_t>();
}

int64_t ConfigObject::positive_int(const std::string& key, int64_t most, int64_t fallback) const {
  return has(key) ? positive_int(key, most) : fallback;
}

int64_t ConfigObject::non_negative_int(const std::string& key, int64_t most, int64_t fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = j_[key];
  if (!fits_int64(v) || v.get<int64_t>() < 0) fail(key, "must be a non-negative integer, got " + v.dump());
  if (v.get<int64_t>() > most) fail(key, v.dump() + " is larger than " + std::to_string(most) + ", the most this plugin supports");
  return v.get<int64_t>();
}

double ConfigObject::positive_number(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  if (!j_[key].is_number() || j_[key].get<double>() <= 0) fail(key, "must be a positive number, got " + j_[key].dump());
  return j_[key].get<double>();
}

double ConfigObject::number_in(const std::string& key, double low, double high, double fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = j_[key];
  if (!v.is_number() || !(v.get<double>() > low) || v.get<double>() > high)
    fail(key, "must be a number in (" + std::to_string(low) + ", " + std::to_string(high) + "], got " + v.dump());
  return v.get<double>();
}

bool ConfigObject::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  if (!j_[key].is_boolean()) fail(key, "must be true or false, got " + j_[key].dump());
  return j_[key].get<bool>();
}

std::string ConfigObject::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  if (!j_[key].is_string()) fail(key, "must be a string, got " + j_[key].dump());
  return j_[key].get<std::string>();
}

std::vector<int64_t> ConfigObject::int_list(const std::string& key, int64_t bound) const {
  std::vector<int64_t> out;
  if (!has(key)) return out;
  if (!j_[key].is_array()) fail(key, "must be a list of integers, got " + j_[key].dump());
  for (const auto& v : j_[key]) {
    if (!fits_int64(v) || v.get<int64_t>() < 0 || v.get<int64_t>() >= bound)
      fail(key, "must hold integers in [0, " + std::to_string(bound) + "), got " + j_[key].dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

GenerationFacts read_generation_facts(const ConfigObject& c, int64_t vocab_size) {
  GenerationFacts g;
  if (c.has("eos_token_id")) {
    const auto& e = c.at("eos_token_id");
    auto id = [&](const nlohmann::json& v) {
      if (!fits_int64(v) || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)
        c.fail("eos_token_id", "must be token ids in [0, vocab_size), got " + e.dump());
      return v.get<int64_t>();
    };
    if (e.is_array())
      for (const auto& v : e) g.eos_token_ids.push_back(id(v));
    else
      g.eos_token_ids.push_back(id(e));
  }
  if (c.has("bos_token_id") && c.at("bos_token_id").is_number_integer()) g.bos_token_id = c.at("bos_token_id").get<int64_t>();
  g.max_position_embeddings = c.non_negative_int("max_position_embeddings", kMaxPositions, 0);
  return g;
}

}  // namespace dflash::hf
