#include "text/utf8.h"

#include <algorithm>
#include <cstdint>

namespace dflash::text::utf8 {
namespace {

bool in(unsigned char b, unsigned char lo, unsigned char hi) { return b >= lo && b <= hi; }

}  // namespace

// Unicode Table 3-7 (well-formed byte sequences): the lead byte fixes the
// length and the range of the second byte; the rest are 80..BF.
std::size_t sequence_length(std::string_view text, std::size_t i, std::size_t& bad) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  bad = 1;
  if (b0 < 0x80) return 1;
  std::size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (in(b0, 0xC2, 0xDF)) {
    length = 2;
  } else if (b0 == 0xE0) {
    length = 3, lo = 0xA0;
  } else if (in(b0, 0xE1, 0xEC) || in(b0, 0xEE, 0xEF)) {
    length = 3;
  } else if (b0 == 0xED) {
    length = 3, hi = 0x9F;  // no surrogates
  } else if (b0 == 0xF0) {
    length = 4, lo = 0x90;
  } else if (in(b0, 0xF1, 0xF3)) {
    length = 4;
  } else if (b0 == 0xF4) {
    length = 4, hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;  // 80..C1, F5..FF: never a lead byte; replaced alone
  }
  // The maximal subpart: the lead byte and every following byte that could
  // still continue it. The first byte that cannot is not consumed.
  for (std::size_t k = 1; k < length; ++k) {
    const bool ok = i + k < text.size() &&
                    (k == 1 ? in(static_cast<unsigned char>(text[i + k]), lo, hi)
                            : in(static_cast<unsigned char>(text[i + k]), 0x80, 0xBF));
    if (!ok) {
      bad = k;
      return 0;
    }
  }
  return length;
}

bool is_valid(std::string_view text) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {  // ASCII runs are most text
      ++i;
      continue;
    }
    const std::size_t n = sequence_length(text, i, bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string make_valid(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = sequence_length(text, i, bad);
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      i += bad;
    }
  }
  return out;
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

char32_t code_point(std::string_view text, std::size_t i, std::size_t n) {
  const auto b = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(text[i + k])); };
  switch (n) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

std::string_view window(std::string_view text, std::size_t begin, std::size_t length) {
  const auto continuation = [&](std::size_t i) {
    return i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80;
  };
  begin = std::min(begin, text.size());
  while (begin > 0 && continuation(begin)) --begin;
  std::size_t end = begin + std::min(length, text.size() - begin);
  while (end > begin && continuation(end)) --end;
  return text.substr(begin, end - begin);
}

}  // namespace dflash::text::utf8
