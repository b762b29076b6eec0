// Reading tokenizer files safely (a regular file below Tokenizer::kMaxFileBytes,
// JSON nested at most 64 deep, no duplicate keys) and the checked field access
// the readers share; every failure is a TokenizerError naming file and key.
#pragma once

#include "json/strict_json.h"
#include "text/components.h"
#include "text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <string_view>

namespace dflash::text::detail {

using nlohmann::json;
namespace fs = std::filesystem;

[[noreturn]] void fail(const fs::path& file, const std::string& key, const std::string& message);

// The whole file. Refuses what is not a regular file (a folder, a pipe, a
// device) and files above Tokenizer::kMaxFileBytes before reading them.
std::string read_file(const fs::path& file);

// Parses JSON text; errors give the line and column. `streams`: containers
// handed over member by member instead of kept in the result.
json parse_json(const std::string& text, const fs::path& file, const std::vector<json_text::Stream>& streams = {});

// "a string", "an array", ... for messages.
std::string describe(const json& value);

// "model" + "vocab" → "model.vocab"; "" + "model" → "model".
std::string key_of(const std::string& parent, std::string_view name);
std::string index_of(const std::string& parent, std::size_t i);

// Checked access to the members of an object; `parent` is its key path.
class Fields {
 public:
  Fields(const fs::path& file, const json& object, std::string parent);
  const fs::path& file() const { return file_; }
  const std::string& key() const { return parent_; }
  std::string key(std::string_view name) const { return key_of(parent_, name); }

  bool has(std::string_view name) const;  // present and not null
  const json& required(std::string_view name) const;
  const json& object(std::string_view name) const;  // required, an object
  const json& array(std::string_view name) const;   // required, an array
  std::string string(std::string_view name) const;  // required, a string
  bool boolean(std::string_view name, bool fallback) const;
  bool boolean(std::string_view name) const;  // required
  [[noreturn]] void fail(std::string_view name, const std::string& message) const;

 private:
  const fs::path& file_;
  const json& object_;
  std::string parent_;
};

// A token id: an integer in [0, kMaxTokenId].
int32_t token_id(const json& value, const fs::path& file, const std::string& key);

}  // namespace dflash::text::detail
