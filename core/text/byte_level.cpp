#include "text/byte_level.h"

#include <utility>

#include "text/utf8.h"

#include <array>

namespace dflash::text::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> char_by_byte{};
  std::array<std::string, 256> utf8_by_byte;
  std::array<int, 512> byte_by_char{};  // every mapped character is below U+0200

  Tables() {
    byte_by_char.fill(-1);
    const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable(b) ? static_cast<char32_t>(b) : next++;
      char_by_byte[b] = c;
      utf8::append(utf8_by_byte[b], c);
      byte_by_char[c] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& char_of(std::uint8_t b) { return tables().utf8_by_byte[b]; }

int byte_of(char32_t c) { return c < 512 ? tables().byte_by_char[c] : -1; }

std::string decoded(std::string_view token) {
  std::optional<std::string> bytes = to_bytes(token);
  return bytes ? std::move(*bytes) : std::string(token);
}

std::optional<std::string> to_bytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < token.size();) {
    const std::size_t n = utf8::sequence_length(token, i, bad);
    if (n == 0) return std::nullopt;
    const int b = byte_of(utf8::code_point(token, i, n));
    if (b < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(b));
    i += n;
  }
  return bytes;
}

std::string from_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) out += char_of(static_cast<std::uint8_t>(b));
  return out;
}

}  // namespace dflash::text::byte_level
