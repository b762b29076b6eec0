// The vocabulary and merges of a byte-level BPE, checked the same way whether
// they come from tokenizer.json or from GPT-2's encoder.json + vocab.bpe.
#pragma once

#include "text/tokenizer_file.h"

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace dflash::text::detail {

// {"token": id, ...}: every id an integer in range, no id given twice.
std::unordered_map<std::string, int32_t> read_vocab(const json& vocab, const fs::path& file, const std::string& key);

// The ids of a merge "left right" and of its result: all three must be tokens
// (HF refuses the file otherwise too).
std::array<int32_t, 3> resolve_merge(const std::unordered_map<std::string, int32_t>& vocab, const std::string& left,
                                     const std::string& right, const fs::path& file, const std::string& key);

// A byte-level vocabulary holds the 256 byte tokens (Ā, ā, ..., Ġ, ...);
// without them some text could not be encoded at all.
void check_byte_alphabet(const std::unordered_map<std::string, int32_t>& vocab, const fs::path& file,
                         const std::string& key);

}  // namespace dflash::text::detail
