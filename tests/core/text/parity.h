// Comparing our encoder with the Node reference (tests/core/text/node/
// reference.js) document by document: shared by the TokenizerParity tests
// (a sample, in CI) and tokenizer_parity (the full corpus, docs/tokenizer.md).
#pragma once

#include "text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dflash::test {

// The documents of a corpus file (JSON lines of {"text": ...}).
std::vector<std::string> read_corpus(const std::filesystem::path& file);

// The reference's rows, one per document: {"doc": i, family: {"ids": [...], "text": "..."}, ...}.
std::vector<nlohmann::json> read_reference(const std::filesystem::path& file);

struct FamilyParity {
  std::string family;
  int64_t documents = 0, bytes = 0, tokens = 0;
  int64_t id_mismatches = 0;      // documents whose ids differ from the reference
  int64_t decode_mismatches = 0;  // documents whose decode(reference ids) differs from the reference's decode
  int64_t round_trip_failures = 0;  // documents where decode(encode(x)) is not x (NFC(x) for NFC tokenizers)
  double encode_seconds = 0;      // ours, all documents, one pass
  std::vector<std::string> reports;  // the first few mismatches, explained
};

// Encodes every document (add_special_tokens as the reference did) and compares.
// round_trip_prefix: what decode puts before the text (e.g. "<|begin_of_text|>").
// nfc: the tokenizer normalizes to NFC, so the round trip gives NFC(x).
FamilyParity compare_family(const text::Tokenizer& tokenizer, const std::string& family,
                            const std::vector<std::string>& documents, const std::vector<nlohmann::json>& reference,
                            bool add_special_tokens, const std::string& round_trip_prefix, bool nfc);

// The ids around the first difference, as token spellings, for a report.
std::string explain_difference(const text::Tokenizer& tokenizer, const std::string& document,
                               const std::vector<int64_t>& ours, const std::vector<int64_t>& reference);

}  // namespace dflash::test
