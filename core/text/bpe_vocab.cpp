#include "text/bpe_vocab.h"

#include "text/byte_level.h"

#include <cstdio>
#include <vector>

namespace dflash::text::detail {
namespace {

std::string as_json(const std::string& token) { return json(token).dump(); }  // JSON-escaped, so control bytes show

}  // namespace

bool VocabBuilder::add(std::string& token, const json& value) {
  // The key is spelt out only for a message: building it for each of 150k
  // entries was a tenth of the load.
  const auto entry = [&] { return key_ + "[" + as_json(token) + "]"; };
  const int32_t id = value.is_number_unsigned() && value.get<uint64_t>() <= static_cast<uint64_t>(kMaxTokenId)
                         ? static_cast<int32_t>(value.get<uint64_t>())
                         : token_id(value, file_, entry());
  const auto slot = static_cast<std::size_t>(id);
  if (slot >= taken_.size()) taken_.resize(slot + 1 + taken_.size() / 2);
  if (vocab_.find(token) != nullptr) return false;
  if (taken_[slot]) {
    std::string other;
    for (const auto& [t, i] : vocab_)
      if (i == id) other = t;
    fail(file_, entry(), "id " + std::to_string(id) + " is also the id of " + as_json(other) +
                             "; each id names one token (the file is damaged or hand-edited)");
  }
  taken_[slot] = true;
  vocab_.insert(token, id);
  return true;
}

TokenTable VocabBuilder::finish() {
  if (vocab_.empty()) fail(file_, key_, "is empty; a BPE vocabulary lists at least the 256 byte tokens");
  return std::move(vocab_);
}

TokenTable read_vocab(const json& vocab, const fs::path& file, const std::string& key) {
  if (!vocab.is_object()) fail(file, key, "must be an object {\"token\": id, ...}, not " + describe(vocab));
  VocabBuilder builder(file, key);
  for (const auto& [token, value] : vocab.items()) {
    std::string t = token;
    builder.add(t, value);  // a parsed object holds each key once
  }
  return builder.finish();
}

std::optional<std::pair<std::string, std::string>> split_merge(const std::string& text) {
  const std::size_t space = text.find(' ');
  if (space == std::string::npos || space == 0 || space + 1 == text.size() ||
      text.find(' ', space + 1) != std::string::npos)
    return std::nullopt;
  return std::make_pair(text.substr(0, space), text.substr(space + 1));
}

std::array<int32_t, 3> resolve_merge(const TokenTable& vocab, const std::string& left,
                                     const std::string& right, const fs::path& file, const std::string& list_key,
                                     std::size_t index) {
  const auto find = [&](const std::string& token, const char* what) {
    const int32_t* id = vocab.find(token);
    if (id == nullptr)
      fail(file, index == std::string::npos ? list_key : index_of(list_key, index),
           "the merge " + as_json(left + " " + right) + " names " + what + " token " + as_json(token) +
               ", which is not in the vocabulary; merges and vocabulary must come from the same tokenizer");
    return *id;
  };
  const int32_t a = find(left, "the left");
  const int32_t b = find(right, "the right");
  const int32_t merged = find(left + right, "the merged");
  return {a, b, merged};
}

void check_byte_alphabet(const TokenTable& vocab, const fs::path& file,
                         const std::string& key) {
  std::vector<std::string> missing;
  for (int b = 0; b < 256; ++b)
    if (vocab.find(byte_level::char_of(static_cast<std::uint8_t>(b))) == nullptr) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      missing.push_back(as_json(byte_level::char_of(static_cast<std::uint8_t>(b))) + " (byte " + hex + ")");
    }
  if (missing.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
  if (missing.size() > 5) list += ", ...";
  fail(file, key, "lacks " + std::to_string(missing.size()) + " of the 256 byte tokens of a byte-level BPE: " + list +
                      "; a ByteLevel pre-tokenizer turns text into these characters, so its vocabulary must spell every byte");
}

}  // namespace dflash::text::detail
