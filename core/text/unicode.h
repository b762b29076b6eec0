// The Unicode work, done by ICU (Debian's libicu): normalization forms, the
// pre-tokenizers' regular expressions (\p{L}, \p{N}, \s+(?!\S), (?i:...) as
// tokenizer.json writes them), and the character classes added tokens test.
// Everything here takes and returns UTF-8; ICU's headers stay in unicode.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dflash::text::unicode {

enum class Form { kNFC, kNFD, kNFKC, kNFKD };

// Normalization forms applied in order (a tokenizer.json "Sequence" of them).
class Normalization {
 public:
  explicit Normalization(const std::vector<Form>& forms);
  bool empty() const { return forms_.empty(); }
  // `text` (valid UTF-8) normalized; text already in the form is returned as is.
  std::string apply(std::string_view text) const;

 private:
  std::vector<const void*> forms_;  // const icu::Normalizer2*, owned by ICU
};

// A compiled regular expression (ICU syntax, which covers what tokenizer.json
// patterns use). Shared between threads; each search makes its own matcher.
class Regex {
 public:
  // Throws std::invalid_argument with ICU's reason and the offset in the
  // pattern. literal: the pattern is a plain string to find.
  Regex(std::string_view pattern, bool literal);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // The [begin, end) byte ranges of the successive matches in `text` (valid
  // UTF-8), as a left-to-right search finds them (empty matches included).
  // Throws std::runtime_error if ICU gives up (e.g. its backtracking limit).
  void find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& matches) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

bool is_white_space(char32_t c);  // the White_Space property (Rust's char::is_whitespace, regex \s)
bool is_word(char32_t c);         // regex \w as Unicode TR18 defines it (the Rust regex crate's \w)

}  // namespace dflash::text::unicode
