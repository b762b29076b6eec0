// The vocabulary and merges of a BPE, checked the same way whether they come
// from tokenizer.json or from GPT-2's encoder.json + vocab.bpe.
#pragma once

#include "text/tokenizer_file.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dflash::text::detail {

// A vocabulary {"token": id, ...} read entry by entry, as the parser streams
// it or from a parsed object: every id an integer in range, no id given twice.
class VocabBuilder {
 public:
  // expected_size: room made at once (a guess; the table grows past it as needed).
  VocabBuilder(const fs::path& file, std::string key, std::size_t expected_size = 0)
      : file_(file), key_(std::move(key)) {
    vocab_.reserve(expected_size);
  }
  // False when `token` was added before (the caller reports the duplicate
  // key); moves from `token` otherwise. Throws TokenizerError for a bad id.
  bool add(std::string& token, const json& id);
  // The vocabulary; refuses an empty one.
  TokenTable finish();

 private:
  fs::path file_;
  std::string key_;
  TokenTable vocab_;
  std::vector<bool> taken_;  // by id; a vocabulary's ids are dense, so this stays small
};

// {"token": id, ...} already parsed (GPT-2's encoder.json).
TokenTable read_vocab(const json& vocab, const fs::path& file, const std::string& key);

// A merge written "left right": its two tokens, or nullopt unless the text is
// exactly two non-empty tokens separated by one space (tokenizer.json's
// string merges, GPT-2's vocab.bpe lines).
std::optional<std::pair<std::string, std::string>> split_merge(const std::string& text);

// The ids of a merge "left right" and of its result: all three must be tokens
// (HF refuses the file otherwise too). The key names the merge in messages:
// `list_key`[`index`], or `list_key` alone where index is npos.
std::array<int32_t, 3> resolve_merge(const TokenTable& vocab, const std::string& left,
                                     const std::string& right, const fs::path& file, const std::string& list_key,
                                     std::size_t index);

// A byte-level vocabulary holds the 256 byte tokens (Ā, ā, ..., Ġ, ...);
// without them some text could not be encoded at all.
void check_byte_alphabet(const TokenTable& vocab, const fs::path& file,
                         const std::string& key);

}  // namespace dflash::text::detail
