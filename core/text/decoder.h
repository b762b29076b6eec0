// A tokenizer.json's "decoder": how the tokens of some ids become text, step
// by step over the list of token strings as Hugging Face's decode_chain runs
// them, then joined. ByteLevel (GPT-2, Qwen, Llama-3, DeepSeek, gpt-oss);
// Replace, ByteFallback, Fuse, Strip and Metaspace (the SentencePiece-style
// Llama-2, Mistral and Gemma files), alone or in a Sequence.
#pragma once

#include "text/unicode.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace dflash::text {

class Decoder {
 public:
  // Every token's characters back to their bytes (a token of other
  // characters, an added one, as its own UTF-8); the whole list becomes one
  // string, ill-formed UTF-8 turned into U+FFFD (from_utf8_lossy).
  void add_byte_level();
  // In every token, each match of `pattern` becomes `content`.
  void add_replace(std::shared_ptr<const unicode::Regex> pattern, std::string content);
  // Runs of "<0xHH>" tokens become the text of their bytes, or one U+FFFD a
  // byte where those bytes are not UTF-8.
  void add_byte_fallback();
  // All tokens become one.
  void add_fuse();
  // Up to `start` leading and `stop` trailing `content` characters off each token.
  void add_strip(char32_t content, std::size_t start, std::size_t stop);
  // Each `replacement` character becomes a space; in the first token it is
  // dropped instead where the pre-tokenizer prepended one (strip_first).
  void add_metaspace(std::string replacement, bool strip_first);

  bool empty() const { return steps_.empty(); }
  // The decoder is ByteLevel alone (each token's bytes can be computed once).
  bool only_byte_level() const { return steps_.size() == 1 && steps_[0].kind == Step::Kind::kByteLevel; }

  std::string decode(std::vector<std::string> tokens) const;

 private:
  struct Step {
    enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
    std::shared_ptr<const unicode::Regex> pattern;
    std::string text;  // Replace's content, Metaspace's replacement
    char32_t strip_char = 0;
    std::size_t start = 0, stop = 0;
    bool strip_first = false;
  };
  std::vector<Step> steps_;
};

}  // namespace dflash::text
