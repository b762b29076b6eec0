// The quickstart target's own format (scripts/make_quickstart_target.py):
//   {"type": "bytes", "vocab_size": 260, "bos_token_id": 256, "eos_token_id": 257, ...}
// Read as a byte-level tokenizer with no merges: ids 0-255 are the bytes,
// the special ids are added tokens named <bos>, <eos>, <pad>, <mask>, and
// add_special_tokens puts BOS first (what the quickstart data was made with).
#include "text/byte_level.h"
#include "text/readers.h"

namespace dflash::text::detail {

Components read_bytes_format(const json& root, const fs::path& file) {
  const Fields f(file, root, "");
  Components c;
  c.source = file;
  const int32_t vocab_size = token_id(f.required("vocab_size"), file, "vocab_size");
  if (vocab_size < 256) f.fail("vocab_size", std::to_string(vocab_size) + " is below 256, the byte ids alone");
  for (int b = 0; b < 256; ++b) {
    std::string spelling = byte_level::char_of(static_cast<std::uint8_t>(b));
    c.vocab.insert(spelling, b);
  }
  for (const char* name : {"bos", "eos", "pad", "mask"}) {
    const std::string key = std::string(name) + "_token_id";
    if (!f.has(key)) continue;
    AddedToken t;
    t.id = token_id(f.required(key), file, key);
    if (t.id < 256 || t.id >= vocab_size)
      f.fail(key, std::to_string(t.id) + " is outside 256 .. " + std::to_string(vocab_size - 1) +
                      " (ids below 256 are bytes; vocab_size bounds the rest)");
    for (const AddedToken& other : c.added)
      if (other.id == t.id) f.fail(key, std::to_string(t.id) + " is also " + other.content + "'s id");
    t.content = "<" + std::string(name) + ">";
    t.special = true;
    t.normalized = false;
    if (std::string(name) == "bos") {
      c.has_template = true;
      c.template_before = {t.id};
    }
    c.added.push_back(t);
  }
  ByteLevelStep whole;  // no regex, no merges: each byte is its token
  whole.use_regex = false;
  c.pre_tokenizer.add(whole);
  c.decoder.add_byte_level();
  return c;
}

}  // namespace dflash::text::detail
