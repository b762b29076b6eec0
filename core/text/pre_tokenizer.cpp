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
  s.kind = Step::Kind::kSplit;
  s.split = std::move(step);
  steps_.push_back(std::move(s));
}

void PreTokenizer::add(ByteLevelStep step) {
  Step s;
  s.kind = Step::Kind::kByteLevel;
  s.byte_level_step = step;
  steps_.push_back(std::move(s));
  has_byte_level_ = true;
}

void PreTokenizer::add(MetaspaceStep step) {
  Step s;
  s.kind = Step::Kind::kMetaspace;
  s.metaspace = std::move(step);
  steps_.push_back(std::move(s));
}

namespace {

// A piece on its way through the steps, and whether it begins the input.
struct Piece {
  std::string text;
  bool at_start = false;
};

void metaspace(const MetaspaceStep& step, Piece& piece, std::vector<Piece>& next) {
  std::string text;
  text.reserve(piece.text.size() + step.replacement.size());
  for (char c : piece.text) {
    if (c == ' ')
      text += step.replacement;
    else
      text += c;
  }
  const bool starts_replaced = text.compare(0, step.replacement.size(), step.replacement) == 0;
  const bool prepend = step.prepend_scheme == PrependScheme::kAlways ||
                       (step.prepend_scheme == PrependScheme::kFirst && piece.at_start);
  if (prepend && !starts_replaced && !text.empty()) text.insert(0, step.replacement);
  if (!step.split) {
    next.push_back({std::move(text), piece.at_start});
    return;
  }
  // Cut before each replacement character: it starts the piece after it.
  std::size_t begin = 0;
  for (std::size_t at = text.find(step.replacement, 1); at != std::string::npos;
       at = text.find(step.replacement, at + step.replacement.size())) {
    next.push_back({text.substr(begin, at - begin), piece.at_start && begin == 0});
    begin = at;
  }
  next.push_back({text.substr(begin), piece.at_start && begin == 0});
}

}  // namespace

void PreTokenizer::run(std::string_view text, std::vector<std::string>& pieces, bool at_input_start) const {
  if (text.empty()) return;  // HF drops empty splits before any pre-tokenizer sees them
  std::vector<Piece> current{{std::string(text), at_input_start}}, next;
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  const auto cut = [&](Piece& piece, SplitBehavior behavior, bool invert) {
    for (const Span& s : split_spans(piece.text.size(), matches, behavior, invert))
      next.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  };
  for (const Step& step : steps_) {
    next.clear();
    for (Piece& piece : current) {
      switch (step.kind) {
        case Step::Kind::kByteLevel:
          // HF adds the space to every piece that reaches ByteLevel without one.
          if (step.byte_level_step.add_prefix_space && (piece.text.empty() || piece.text[0] != ' '))
            piece.text.insert(0, 1, ' ');
          if (!step.byte_level_step.use_regex) {
            next.push_back(std::move(piece));
            break;
          }
          gpt2_regex().find_all(piece.text, matches);
          cut(piece, SplitBehavior::kIsolated, false);
          break;
        case Step::Kind::kSplit:
          step.split.pattern->find_all(piece.text, matches);
          cut(piece, step.split.behavior, step.split.invert);
          break;
        case Step::Kind::kMetaspace:
          metaspace(step.metaspace, piece, next);
          break;
      }
    }
    current.swap(next);
  }
  for (Piece& piece : current)
    if (!piece.text.empty()) pieces.push_back(std::move(piece.text));
}

}  // namespace dflash::text
