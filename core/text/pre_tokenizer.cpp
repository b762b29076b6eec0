#include "text/pre_tokenizer.h"

#include <algorithm>

namespace dflash::text {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

const unicode::Regex& gpt2_regex() {
  static const unicode::Regex regex(kGpt2Pattern, /*literal=*/false);
  return regex;
}

// The ranges of one search, matched and not, in order (HF's find_matches).
std::vector<Span> all_spans(std::size_t length, const std::vector<std::pair<std::size_t, std::size_t>>& matches) {
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  std::size_t previous = 0;
  for (const auto& [begin, end] : matches) {
    if (previous != begin) spans.push_back({previous, begin, false});
    spans.push_back({begin, end, true});
    previous = end;
  }
  if (previous != length) spans.push_back({previous, length, false});
  return spans;
}

}  // namespace

std::vector<Span> split_spans(std::size_t length, const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                              SplitBehavior behavior, bool invert) {
  std::vector<Span> spans = all_spans(length, matches);
  if (invert)
    for (Span& s : spans) s.match = !s.match;
  std::vector<Span> out;
  out.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans)
        if (!s.match) out.push_back(s);
      break;
    case SplitBehavior::kIsolated:
      out = spans;
      break;
    case SplitBehavior::kMergedWithPrevious:
      // A delimiter joins the piece before it (unless that was a delimiter too).
      for (const Span& s : spans) {
        if (s.match && !previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back(s);
        previous_match = s.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      // The mirror image: walk backwards, a delimiter joins the piece after it.
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !previous_match && !out.empty())
          out.back().begin = it->begin;
        else
          out.push_back(*it);
        previous_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case SplitBehavior::kContiguous:
      // Runs of delimiters become one piece, as do runs of non-delimiters.
      for (const Span& s : spans) {
        if (s.match == previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back(s);
        previous_match = s.match;
      }
      break;
  }
  std::vector<Span> kept;
  kept.reserve(out.size());
  for (const Span& s : out)
    if (s.end > s.begin) kept.push_back(s);
  return kept;
}

void PreTokenizer::add(SplitStep step) {
  Step s;
  s.split = std::move(step);
  steps_.push_back(std::move(s));
}

void PreTokenizer::add(ByteLevelStep step) {
  Step s;
  s.byte_level_step = step;
  s.byte_level = true;
  steps_.push_back(std::move(s));
  has_byte_level_ = true;
}

void PreTokenizer::run(std::string_view text, std::vector<std::string>& pieces) const {
  if (text.empty()) return;  // HF drops empty splits before any pre-tokenizer sees them
  std::vector<std::string> current{std::string(text)}, next;
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string& piece : current) {
      if (step.byte_level) {
        // HF adds the space to every piece that reaches ByteLevel without one.
        if (step.byte_level_step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, 1, ' ');
        if (!step.byte_level_step.use_regex) {
          next.push_back(std::move(piece));
          continue;
        }
        gpt2_regex().find_all(piece, matches);
        for (const Span& s : split_spans(piece.size(), matches, SplitBehavior::kIsolated, false))
          next.emplace_back(piece, s.begin, s.end - s.begin);
      } else {
        step.split.pattern->find_all(piece, matches);
        for (const Span& s : split_spans(piece.size(), matches, step.split.behavior, step.split.invert))
          next.emplace_back(piece, s.begin, s.end - s.begin);
      }
    }
    current.swap(next);
  }
  for (std::string& piece : current)
    if (!piece.empty()) pieces.push_back(std::move(piece));
}

}  // namespace dflash::text
