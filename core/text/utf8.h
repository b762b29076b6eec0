// UTF-8 validity and repair. Ill-formed input is replaced the way Rust's
// String::from_utf8_lossy and the WHATWG TextDecoder do (Unicode §3.9,
// "substitution of maximal subparts"), so decoded text matches Hugging Face's.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dflash::text::utf8 {

// The length of the well-formed sequence starting at text[i], or 0 when the
// bytes there are ill-formed; then `bad` is the length of the maximal subpart
// to replace by one U+FFFD (at least 1).
std::size_t sequence_length(std::string_view text, std::size_t i, std::size_t& bad);

bool is_valid(std::string_view text);

// `text` with every maximal ill-formed subpart replaced by U+FFFD.
std::string make_valid(std::string_view text);

// text[begin, begin + length) moved to character boundaries (the start
// back, the end back), so a quoted excerpt never cuts a character in two.
std::string_view window(std::string_view text, std::size_t begin, std::size_t length);

// Appends the UTF-8 form of code point `c` (which must be a scalar value).
void append(std::string& out, char32_t c);

// The code point of the well-formed sequence at text[i] (length `n`).
char32_t code_point(std::string_view text, std::size_t i, std::size_t n);

}  // namespace dflash::text::utf8
