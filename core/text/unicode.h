// The Unicode work, done by ICU (Debian's libicu): normalization forms, the
// pre-tokenizers' regular expressions (\p{L}, \p{N}, \s+(?!\S), (?i:...) as
// tokenizer.json writes them), and the character classes added tokens test.
// Everything here takes and returns UTF-8; ICU's headers stay in unicode.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
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
  // ICU's match engine counts its work in steps of 10,000 operations; a
  // search that takes more than this many on one match (a pattern that
  // backtracks exponentially, as (a|aa)+$ on a run of a's) is stopped, where
  // ICU alone would run for minutes or hours. Well-formed pre-tokenizer
  // patterns take a few steps per match on any text.
  static constexpr int32_t kDefaultTimeLimitSteps = 20000;
  // The backtracking heap one search may use: ICU's own default, 8 MB, is
  // too small for the GPT-2 pattern on a whitespace run of 1 MB (it needs
  // under 64 MB); 512 MiB takes runs of several MB. Not 1 GiB: ICU 72
  // reported an overflow at once there on the 1 MB run (its limit
  // arithmetic; 2^29 and below behave).
  static constexpr int32_t kStackLimitBytes = 1 << 29;

  // Throws std::invalid_argument with ICU's reason and the offset in the
  // pattern. literal: the pattern is a plain string to find. origin names
  // where the pattern comes from in messages (a file and key).
  Regex(std::string_view pattern, bool literal, std::string origin = {},
        int32_t time_limit_steps = kDefaultTimeLimitSteps);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // The [begin, end) byte ranges of the successive matches in `text` (valid
  // UTF-8), as a left-to-right search finds them (empty matches included).
  // Throws std::runtime_error naming the origin and the pattern if ICU
  // gives up (its time or backtracking limit).
  void find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& matches) const;

 private:
  static std::string quoted_pattern(const std::string& pattern);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

bool is_white_space(char32_t c);  // the White_Space property (Rust's char::is_whitespace, regex \s)
bool is_word(char32_t c);         // regex \w as Unicode TR18 defines it (the Rust regex crate's \w)

}  // namespace dflash::text::unicode
