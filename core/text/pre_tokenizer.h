// Pre-tokenization: cutting normalized text into the pieces BPE merges within
// (tokenizer.json "pre_tokenizer"). Split (a regex or string, with HF's five
// delimiter behaviours), ByteLevel (optional prefix space, optional GPT-2
// regex) and Metaspace (spaces as "▁", a prefix, optional split), alone or
// in a Sequence, as the GPT-2, Qwen, Llama-3, DeepSeek, gpt-oss files and the
// SentencePiece-style Llama-2 / Mistral ones use.
#pragma once

#include "text/unicode.h"

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dflash::text {

// What happens to the matched delimiters (HF's SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One [begin, end) range of a text and whether the pattern matched it.
struct Span {
  std::size_t begin = 0, end = 0;
  bool match = false;
};

// The text's ranges between and at `matches`, as HF's Pattern::find_matches
// lists them, then grouped by `behavior` (HF's NormalizedString::split);
// empty ranges are dropped. invert: the matches are the pieces to keep.
std::vector<Span> split_spans(std::size_t length, const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                              SplitBehavior behavior, bool invert);

struct SplitStep {
  std::shared_ptr<const unicode::Regex> pattern;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

struct ByteLevelStep {
  bool add_prefix_space = false;
  bool use_regex = true;  // split with GPT-2's pattern first
};

// Where Metaspace puts its replacement character before a piece.
enum class PrependScheme { kAlways, kFirst, kNever };  // kFirst: only before the input's first piece

struct MetaspaceStep {
  std::string replacement = "\xE2\x96\x81";  // U+2581 "▁"
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;  // cut before each replacement character (HF: MergedWithNext)
};

class PreTokenizer {
 public:
  void add(SplitStep step);
  void add(ByteLevelStep step);
  void add(MetaspaceStep step);
  bool has_byte_level() const { return has_byte_level_; }
  bool empty() const { return steps_.empty(); }

  // Appends the pieces of `text` (valid UTF-8) to `pieces`. at_input_start:
  // `text` begins the input (no added token before it), where Metaspace's
  // "first" scheme prepends (HF: the piece's original offset is 0).
  void run(std::string_view text, std::vector<std::string>& pieces, bool at_input_start = true) const;

 private:
  struct Step {
    enum class Kind { kSplit, kByteLevel, kMetaspace } kind = Kind::kSplit;
    SplitStep split;
    ByteLevelStep byte_level_step;
    MetaspaceStep metaspace;
  };
  std::vector<Step> steps_;
  bool has_byte_level_ = false;
};

// GPT-2's pattern, which ByteLevel with use_regex applies (the same string HF compiles).
extern const char* const kGpt2Pattern;

}  // namespace dflash::text
