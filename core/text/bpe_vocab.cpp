#include "text/bpe_vocab.h"

#include "text/byte_level.h"

#include <cstdio>
#include <vector>

namespace dflash::text::detail {
namespace {

std::string as_json(const std::string& token) { return json(token).dump(); }  // JSON-escaped, so control bytes show

}  // namespace

std::unordered_map<std::string, int32_t> read_vocab(const json& vocab, const fs::path& file, const std::string& key) {
  if (!vocab.is_object()) fail(file, key, "must be an object {\"token\": id, ...}, not " + describe(vocab));
  if (vocab.empty()) fail(file, key, "is empty; a BPE vocabulary lists at least the 256 byte tokens");
  std::unordered_map<std::string, int32_t> out;
  out.reserve(vocab.size());
  std::vector<bool> taken;  // by id; a vocabulary's ids are dense, so this stays small
  for (const auto& [token, value] : vocab.items()) {
    const std::string entry = key + "[" + as_json(token) + "]";
    const int32_t id = token_id(value, file, entry);
    if (static_cast<std::size_t>(id) >= taken.size()) taken.resize(static_cast<std::size_t>(id) + 1 + taken.size() / 2);
    if (taken[static_cast<std::size_t>(id)]) {
      std::string other;
      for (const auto& [t, i] : out)
        if (i == id) other = t;
      fail(file, entry, "id " + std::to_string(id) + " is also the id of " + as_json(other) +
                            "; each id names one token (the file is damaged or hand-edited)");
    }
    taken[static_cast<std::size_t>(id)] = true;
    out.emplace(token, id);
  }
  return out;
}

std::array<int32_t, 3> resolve_merge(const std::unordered_map<std::string, int32_t>& vocab, const std::string& left,
                                     const std::string& right, const fs::path& file, const std::string& key) {
  const auto find = [&](const std::string& token, const char* what) {
    const auto it = vocab.find(token);
    if (it == vocab.end())
      fail(file, key, "the merge " + as_json(left + " " + right) + " names " + what + " token " + as_json(token) +
                          ", which is not in the vocabulary; merges and vocabulary must come from the same tokenizer");
    return it->second;
  };
  const int32_t a = find(left, "the left");
  const int32_t b = find(right, "the right");
  const int32_t merged = find(left + right, "the merged");
  return {a, b, merged};
}

void check_byte_alphabet(const std::unordered_map<std::string, int32_t>& vocab, const fs::path& file,
                         const std::string& key) {
  std::vector<std::string> missing;
  for (int b = 0; b < 256; ++b)
    if (vocab.find(byte_level::char_of(static_cast<std::uint8_t>(b))) == vocab.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      missing.push_back(as_json(byte_level::char_of(static_cast<std::uint8_t>(b))) + " (byte " + hex + ")");
    }
  if (missing.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
  if (missing.size() > 5) list += ", ...";
  fail(file, key, "lacks " + std::to_string(missing.size()) + " of the 256 byte tokens of a byte-level BPE: " + list +
                      "; only byte-level BPE vocabularies (GPT-2, Qwen, Llama-3) are supported");
}

}  // namespace dflash::text::detail
