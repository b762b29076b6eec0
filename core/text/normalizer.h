// A tokenizer.json's "normalizer": its steps in order. Unicode forms (NFC,
// NFD, NFKC, NFKD), Replace (a string or regex, every match) and Prepend (a
// prefix on non-empty text), alone or in a Sequence: the byte-level files
// use a form, the SentencePiece-style ones (Llama-2, Mistral, Gemma) write
// spaces as "▁" with Replace and Prepend.
#pragma once

#include "text/unicode.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dflash::text {

class Normalizer {
 public:
  void add_form(unicode::Form form);
  // Every match of `pattern` (left to right, not overlapping) becomes `content`.
  void add_replace(std::shared_ptr<const unicode::Regex> pattern, std::string content);
  // `prefix` before the text, unless the text is empty (HF's Prepend).
  void add_prepend(std::string prefix);

  bool empty() const { return steps_.empty(); }
  // `text` (valid UTF-8) through every step.
  std::string apply(std::string_view text) const;

 private:
  struct Step {
    enum class Kind { kForm, kReplace, kPrepend } kind;
    std::shared_ptr<const unicode::Normalization> form;
    std::shared_ptr<const unicode::Regex> pattern;
    std::string text;  // Replace's content, Prepend's prefix
  };
  std::vector<Step> steps_;
};

// Every match of `pattern` in `text` replaced by `content` (shared with the
// decoder's Replace).
std::string replace_all(const unicode::Regex& pattern, std::string_view text, std::string_view content);

}  // namespace dflash::text
