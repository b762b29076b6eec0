#include "text/added_tokens.h"

#include "text/unicode.h"
#include "text/utf8.h"

#include <algorithm>

namespace dflash::text {
namespace {

// The code point ending just before byte `at` of valid UTF-8 text (at > 0).
char32_t code_point_before(std::string_view text, std::size_t at) {
  std::size_t begin = at - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  return utf8::code_point(text, begin, at - begin);
}

char32_t code_point_at(std::string_view text, std::size_t at, std::size_t& length) {
  std::size_t bad = 0;
  length = utf8::sequence_length(text, at, bad);
  if (length == 0) {  // the text is valid UTF-8; this is only a guard
    length = 1;
    return 0xFFFD;
  }
  return utf8::code_point(text, at, length);
}

// Where the whitespace that ends text[0, at) begins (at itself when none).
std::size_t whitespace_before(std::string_view text, std::size_t at) {
  while (at > 0) {
    std::size_t begin = at - 1;
    while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
    if (!unicode::is_white_space(utf8::code_point(text, begin, at - begin))) break;
    at = begin;
  }
  return at;
}

// Where the whitespace that starts text[at, ...) ends.
std::size_t whitespace_after(std::string_view text, std::size_t at) {
  while (at < text.size()) {
    std::size_t length = 0;
    if (!unicode::is_white_space(code_point_at(text, at, length))) break;
    at += length;
  }
  return at;
}

}  // namespace

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  for (const auto& [b, next] : nodes_[static_cast<std::size_t>(node)].children)
    if (b == byte) return next;
  return -1;
}

void AddedTokenMatcher::add(std::string_view pattern, int32_t index, const AddedToken& token) {
  if (pattern.empty()) return;  // HF ignores empty added tokens
  int32_t node = 0;
  for (char c : pattern) {
    const auto byte = static_cast<unsigned char>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_[static_cast<std::size_t>(node)].children.emplace_back(byte, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  nodes_[static_cast<std::size_t>(node)].token = index;
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  if (rules_.size() <= static_cast<std::size_t>(index)) rules_.resize(static_cast<std::size_t>(index) + 1);
  rules_[static_cast<std::size_t>(index)] = {token.lstrip, token.rstrip, token.single_word};
}

std::pair<int32_t, std::size_t> AddedTokenMatcher::longest_at(std::string_view text, std::size_t at) const {
  std::pair<int32_t, std::size_t> best{-1, 0};
  int32_t node = 0;
  for (std::size_t i = at; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    const int32_t token = nodes_[static_cast<std::size_t>(node)].token;
    if (token >= 0) best = {token, i + 1 - at};
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& segments) const {
  std::size_t done = 0;  // the end of the last segment emitted (HF's start_offset)
  std::size_t search = 0;
  while (search < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[search])]) {
      ++search;
      continue;
    }
    const auto [token, length] = longest_at(text, search);
    if (token < 0) {
      ++search;
      continue;
    }
    std::size_t begin = search, end = search + length;
    search = end;  // the next match is looked for after this one, taken or not
    const Rules& rules = rules_[static_cast<std::size_t>(token)];
    if (rules.single_word) {
      std::size_t n = 0;
      const bool space_before = begin == 0 || !unicode::is_word(code_point_before(text, begin));
      const bool space_after = end == text.size() || !unicode::is_word(code_point_at(text, end, n));
      if (!space_before || !space_after) continue;
    }
    if (rules.lstrip) begin = std::max(whitespace_before(text, begin), done);
    if (rules.rstrip) {
      end = whitespace_after(text, end);
      search = end;
    }
    if (done < begin) segments.push_back({done, begin, -1});
    segments.push_back({begin, end, token});
    done = end;
  }
  if (done < text.size()) segments.push_back({done, text.size(), -1});
}

}  // namespace dflash::text
