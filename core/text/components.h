// What a tokenizer file describes, read and checked: the readers
// (tokenizer_json.cpp, gpt2_files.cpp, bytes_format.cpp) fill it, and
// tokenizer.cpp builds the encoder from it.
#pragma once

#include "text/added_tokens.h"
#include "text/decoder.h"
#include "text/normalizer.h"
#include "text/pre_tokenizer.h"
#include "text/token_table.h"
#include "text/unicode.h"

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dflash::text::detail {

// Ids are kept below 2^24: real vocabularies are 50k-260k tokens, and a
// bigger id would only make the id tables huge.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

struct Components {
  std::filesystem::path source;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;  // has a ByteLevel step: a byte-level BPE; else its symbols are characters
  TokenTable vocab;                                // spelling → id
  std::vector<std::array<int32_t, 3>> merges;      // left, right, merged; by rank
  bool ignore_merges = false;
  // A character-level BPE's fallbacks for characters not in the vocabulary.
  bool byte_fallback = false;    // their bytes' "<0xHH>" tokens
  int32_t unk_id = -1;           // else the unknown token (-1: none, the character is dropped)
  bool fuse_unk = false;         // a run of unknown characters as one
  Decoder decoder;
  std::vector<AddedToken> added;
  // add_special_tokens: the ids before and after the text (the post-processor's single template).
  bool has_template = false;
  std::vector<int64_t> template_before, template_after;
};

}  // namespace dflash::text::detail
