#include "text/decoder.h"

#include "text/byte_level.h"
#include "text/normalizer.h"
#include "text/utf8.h"

#include <optional>
#include <utility>

namespace dflash::text {
namespace {

const char* const kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

std::vector<std::string> byte_level_decode(std::vector<std::string> tokens) {
  std::string bytes;
  for (const std::string& t : tokens) bytes += byte_level::decoded(t);
  return {utf8::is_valid(bytes) ? bytes : utf8::make_valid(bytes)};
}

// "<0x41>" → 0x41; anything else is not a byte token.
std::optional<unsigned char> byte_token(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  unsigned value = 0;
  for (std::size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + static_cast<unsigned>(digit);
  }
  return static_cast<unsigned char>(value);
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string pending;  // the bytes of the current run of byte tokens
  const auto flush = [&] {
    if (pending.empty()) return;
    if (utf8::is_valid(pending))
      out.push_back(std::move(pending));
    else
      for (std::size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementCharacter);
    pending.clear();
  };
  for (std::string& t : tokens) {
    if (const auto b = byte_token(t)) {
      pending.push_back(static_cast<char>(*b));
      continue;
    }
    flush();
    out.push_back(std::move(t));
  }
  flush();
  return out;
}

std::vector<char32_t> code_points(const std::string& text) {
  std::vector<char32_t> out;
  for (std::size_t i = 0; i < text.size();) {
    std::size_t bad = 0;
    const std::size_t n = utf8::sequence_length(text, i, bad);
    out.push_back(n == 0 ? 0xFFFD : utf8::code_point(text, i, n));
    i += n == 0 ? bad : n;
  }
  return out;
}

std::string strip(const std::string& token, char32_t content, std::size_t start, std::size_t stop) {
  const std::vector<char32_t> chars = code_points(token);
  std::size_t from = 0, to = chars.size();
  while (from < start && from < to && chars[from] == content) ++from;
  for (std::size_t i = 0; i < stop && to > from && chars[to - 1] == content; ++i) --to;
  std::string out;
  for (std::size_t i = from; i < to; ++i) utf8::append(out, chars[i]);
  return out;
}

}  // namespace

void Decoder::add_byte_level() { steps_.push_back({Step::Kind::kByteLevel, nullptr, {}, 0, 0, 0, false}); }

void Decoder::add_replace(std::shared_ptr<const unicode::Regex> pattern, std::string content) {
  steps_.push_back({Step::Kind::kReplace, std::move(pattern), std::move(content), 0, 0, 0, false});
}

void Decoder::add_byte_fallback() { steps_.push_back({Step::Kind::kByteFallback, nullptr, {}, 0, 0, 0, false}); }

void Decoder::add_fuse() { steps_.push_back({Step::Kind::kFuse, nullptr, {}, 0, 0, 0, false}); }

void Decoder::add_strip(char32_t content, std::size_t start, std::size_t stop) {
  steps_.push_back({Step::Kind::kStrip, nullptr, {}, content, start, stop, false});
}

void Decoder::add_metaspace(std::string replacement, bool strip_first) {
  steps_.push_back({Step::Kind::kMetaspace, nullptr, std::move(replacement), 0, 0, 0, strip_first});
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kByteLevel:
        tokens = byte_level_decode(std::move(tokens));
        break;
      case Step::Kind::kReplace:
        for (std::string& t : tokens) t = replace_all(*step.pattern, t, step.text);
        break;
      case Step::Kind::kByteFallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case Step::Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case Step::Kind::kStrip:
        for (std::string& t : tokens) t = strip(t, step.strip_char, step.start, step.stop);
        break;
      case Step::Kind::kMetaspace:
        // HF: in the first token every replacement character goes (not only a
        // leading one) when the pre-tokenizer prepends; elsewhere each is a space.
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          const std::string& t = tokens[i];
          for (std::size_t at = 0; at < t.size();) {
            if (t.compare(at, step.text.size(), step.text) == 0) {
              if (!(i == 0 && step.strip_first)) out += ' ';
              at += step.text.size();
            } else {
              out += t[at++];
            }
          }
          tokens[i] = std::move(out);
        }
        break;
    }
  }
  std::string text;
  for (const std::string& t : tokens) text += t;
  return utf8::is_valid(text) ? text : utf8::make_valid(text);
}

}  // namespace dflash::text
