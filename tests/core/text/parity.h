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

// A family of reference.js: where its file is, how it is encoded, what its
// round trip gives.
struct ParityFamily {
  std::string name;
  // Under the Node project (node_modules/...), or under the reference's
  // --variant-dir for the files reference.js writes (variant: true).
  std::string file;
  bool variant = false;
  // decode(encode(x)) is round_trip_prefix + x (NFC(x) where nfc). Not checked
  // where round_trip is false: SentencePiece-style files decode the space
  // they add after an added token, or drop the first token's "▁" of the text.
  bool round_trip = true;
  std::string round_trip_prefix;
  bool nfc = false;
  // The space mark "▁" (U+2581) written in the text comes back as a space
  // (Gemma's normalizer writes spaces as it; its decoder reads it back).
  bool space_mark_decodes_as_space = false;
};

// Every family reference.js knows, in its order.
const std::vector<ParityFamily>& parity_families();
const ParityFamily& parity_family(const std::string& name);  // throws std::invalid_argument for an unknown name

// The family's tokenizer file (or GPT-2's folder).
std::filesystem::path family_file(const ParityFamily& family, const std::filesystem::path& node_dir,
                                  const std::filesystem::path& variant_dir);

// Encodes every document (with add_special_tokens where the reference's rows
// say it did) and compares.
FamilyParity compare_family(const text::Tokenizer& tokenizer, const ParityFamily& family,
                            const std::vector<std::string>& documents, const std::vector<nlohmann::json>& reference);

// The ids around the first difference, as token spellings, for a report.
std::string explain_difference(const text::Tokenizer& tokenizer, const std::string& document,
                               const std::vector<int64_t>& ours, const std::vector<int64_t>& reference);

}  // namespace dflash::test
