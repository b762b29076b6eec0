// GPT-2's byte-to-character mapping (bytes_to_unicode), which byte-level BPE
// vocabularies are written in: the 188 printable bytes (! .. ~, ¡ .. ¬, ® .. ÿ)
// stand for themselves and the other 68 for U+0100 + n, in byte order. So
// "Ġthe" is the bytes " the".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dflash::text::byte_level {

// The character standing for byte `b`, as UTF-8.
const std::string& char_of(std::uint8_t b);

// The byte that code point `c` stands for, or -1 when it is not one of the 256.
int byte_of(char32_t c);

// The raw bytes a vocabulary token stands for, when each of its characters
// is one of the 256 (every token a byte-level BPE can produce is); nullopt
// otherwise (e.g. an added token written in ordinary text, "<|im_start|>" is
// the exception that maps to itself).
std::optional<std::string> to_bytes(std::string_view token);

// The bytes HF's ByteLevel decoder gives one token: to_bytes where every
// character is a byte character, else (an added token in plain text) the
// token's own UTF-8.
std::string decoded(std::string_view token);

// The vocabulary spelling of raw bytes.
std::string from_bytes(std::string_view bytes);

}  // namespace dflash::text::byte_level
