#include "text/unicode.h"

#include "text/utf8.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf16.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <stdexcept>

namespace dflash::text::unicode {
namespace {

const icu::Normalizer2* instance(Form form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case Form::kNFC: n = icu::Normalizer2::getNFCInstance(status); break;
    case Form::kNFD: n = icu::Normalizer2::getNFDInstance(status); break;
    case Form::kNFKC: n = icu::Normalizer2::getNFKCInstance(status); break;
    case Form::kNFKD: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  if (U_FAILURE(status) || n == nullptr)
    throw std::runtime_error(std::string("ICU cannot load its normalization data (") + u_errorName(status) +
                             "); is the libicu data library installed?");
  return n;
}

icu::StringPiece piece(std::string_view s) { return icu::StringPiece(s.data(), static_cast<int32_t>(s.size())); }

}  // namespace

Normalization::Normalization(const std::vector<Form>& forms) {
  for (Form f : forms) forms_.push_back(instance(f));
}

std::string Normalization::apply(std::string_view text) const {
  std::string current(text);
  for (const void* f : forms_) {
    const auto* n = static_cast<const icu::Normalizer2*>(f);
    UErrorCode status = U_ZERO_ERROR;
    // Most text is already normalized: the check is a fast scan.
    if (n->isNormalizedUTF8(piece(current), status) && U_SUCCESS(status)) continue;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(current.size()));
    n->normalizeUTF8(0, piece(current), sink, nullptr, status);
    if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU normalization failed: ") + u_errorName(status));
    current.swap(out);
  }
  return current;
}

struct Regex::Impl {
  std::unique_ptr<icu::RegexPattern> pattern;
  std::string text, origin;
  int32_t time_limit_steps = 0;
};

Regex::Regex(std::string_view pattern, bool literal, std::string origin, int32_t time_limit_steps)
    : impl_(std::make_unique<Impl>()) {
  impl_->text = std::string(pattern);
  impl_->origin = std::move(origin);
  impl_->time_limit_steps = time_limit_steps;
  UParseError where{};
  UErrorCode status = U_ZERO_ERROR;
  impl_->pattern.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(piece(pattern)),
                                                  literal ? UREGEX_LITERAL : 0, where, status));
  if (U_FAILURE(status) || !impl_->pattern) {
    throw std::invalid_argument(std::string("ICU cannot compile the regular expression (") + u_errorName(status) +
                                (where.offset >= 0 ? ", at character " + std::to_string(where.offset + 1) : std::string()) +
                                ")");
  }
}

Regex::~Regex() = default;

// The pattern as a JSON string literal, cut after 200 bytes (at a character).
std::string Regex::quoted_pattern(const std::string& pattern) {
  const std::string_view shown = utf8::window(pattern, 0, 200);
  return nlohmann::json(std::string(shown)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         (shown.size() < pattern.size() ? "…" : "");
}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& matches) const {
  matches.clear();
  if (text.empty()) return;
  // ICU searches UTF-16; the matches come back as UTF-16 offsets, turned into
  // byte offsets by one forward walk (matches never go backwards).
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(piece(text));
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(impl_->pattern->matcher(u, status));
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU cannot start a regex search: ") + u_errorName(status));
  // ICU keeps a backtracking frame per repetition of a group such as
  // \s+(?!\S); its default 8 MB stack overflows on a whitespace run of a few
  // hundred kB. The heap it may use grows with the text, up to a bound; the
  // time limit stops a pattern that backtracks without end.
  matcher->setStackLimit(kStackLimitBytes, status);
  matcher->setTimeLimit(impl_->time_limit_steps, status);
  const char16_t* units = u.getBuffer();
  const int32_t length = u.length();
  int32_t at16 = 0;
  std::size_t at8 = 0;
  const auto to_bytes = [&](int32_t target) {
    while (at16 < target) {
      const char16_t c = units[at16];
      if (U16_IS_LEAD(c) && at16 + 1 < length && U16_IS_TRAIL(units[at16 + 1])) {
        at8 += 4, at16 += 2;
      } else {
        at8 += c < 0x80 ? 1 : c < 0x800 ? 2 : 3;
        at16 += 1;
      }
    }
    return at8;
  };
  while (matcher->find(status) && U_SUCCESS(status)) {
    const int32_t begin = matcher->start(status);
    const int32_t end = matcher->end(status);
    if (U_FAILURE(status)) break;
    const std::size_t b = to_bytes(begin);
    matches.emplace_back(b, to_bytes(end));
  }
  if (U_FAILURE(status)) {
    const std::string who = (impl_->origin.empty() ? std::string() : impl_->origin + ": ") + "the pattern " +
                            quoted_pattern(impl_->text);
    if (status == U_REGEX_TIME_OUT)
      throw std::runtime_error(who + " took more than ICU's time limit (" + std::to_string(impl_->time_limit_steps) +
                               " steps of 10,000 operations) on a text of " + std::to_string(text.size()) +
                               " bytes: it backtracks without bound on such input; simplify it (no nested or "
                               "overlapping repetition such as (a|aa)+)");
    if (status == U_REGEX_STACK_OVERFLOW)
      throw std::runtime_error(who + " needed more than " + std::to_string(kStackLimitBytes >> 20) +
                               " MiB of backtracking memory on a text of " + std::to_string(text.size()) +
                               " bytes; simplify it");
    throw std::runtime_error(who + ": ICU's regex search failed (" + u_errorName(status) + ") on a text of " +
                             std::to_string(text.size()) + " bytes");
  }
}

bool is_white_space(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE); }

bool is_word(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  return u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || (U_GET_GC_MASK(cp) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
         u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL);
}

}  // namespace dflash::text::unicode
