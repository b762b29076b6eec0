// Rendered chat text → token ids and a loss mask, with the ids exactly those
// of encoding the whole text at once (what the model saw in training).
#pragma once

#include "prepare/chat_format.h"
#include "text/tokenizer.h"

#include <cstdint>
#include <vector>

namespace dflash::prepare {

struct Encoded {
  std::vector<int64_t> ids;
  std::vector<uint8_t> loss_mask;  // 1: supervised
};

// Each unit is encoded on its own (units begin with a special token, where a
// tokenizer splits anyway) and its pieces' boundaries are found by encoding
// each prefix of the unit: a token that spans a boundary (a merge across it)
// belongs to the later piece. add_special_tokens: the tokenizer's template
// (e.g. a BOS) around the whole, as for plain text.
Encoded encode_units(const text::Tokenizer& tokenizer, const std::vector<Unit>& units);

// Plain text, every token supervised (add_special_tokens as the tokenizer's
// post-processor has it, e.g. Llama-3's BOS).
Encoded encode_text(const text::Tokenizer& tokenizer, const std::string& text);

}  // namespace dflash::prepare
