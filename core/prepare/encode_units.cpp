#include "prepare/encode_units.h"

#include <algorithm>

namespace dflash::prepare {
namespace {

// How many leading tokens of `whole` the encoding of a prefix of its text
// owns: all of them when the prefix's tokens start `whole`, else those before
// the first difference (the token there straddles the boundary).
size_t tokens_owned_by_prefix(const std::vector<int64_t>& whole, const std::vector<int64_t>& prefix) {
  const size_t n = std::min(whole.size(), prefix.size());
  size_t same = 0;
  while (same < n && whole[same] == prefix[same]) ++same;
  return same;
}

void append_unit(const text::Tokenizer& tokenizer, const Unit& unit, Encoded& out) {
  std::string text;
  for (const Piece& piece : unit) text += piece.text;
  const std::vector<int64_t> ids = tokenizer.encode(text);
  std::string prefix;
  size_t begin = 0;
  for (size_t p = 0; p < unit.size(); ++p) {
    prefix += unit[p].text;
    const size_t end =
        p + 1 == unit.size() ? ids.size() : std::max(begin, tokens_owned_by_prefix(ids, tokenizer.encode(prefix)));
    out.ids.insert(out.ids.end(), ids.begin() + static_cast<std::ptrdiff_t>(begin),
                   ids.begin() + static_cast<std::ptrdiff_t>(end));
    out.loss_mask.insert(out.loss_mask.end(), end - begin, unit[p].supervised ? 1 : 0);
    begin = end;
  }
}

}  // namespace

Encoded encode_units(const text::Tokenizer& tokenizer, const std::vector<Unit>& units) {
  Encoded out;
  for (const Unit& unit : units) append_unit(tokenizer, unit, out);
  return out;
}

Encoded encode_text(const text::Tokenizer& tokenizer, const std::string& text) {
  Encoded out;
  out.ids = tokenizer.encode(text, /*add_special_tokens=*/true);
  out.loss_mask.assign(out.ids.size(), 1);
  return out;
}

}  // namespace dflash::prepare
