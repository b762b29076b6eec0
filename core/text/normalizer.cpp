#include "text/normalizer.h"

#include <utility>

namespace dflash::text {

std::string replace_all(const unicode::Regex& pattern, std::string_view text, std::string_view content) {
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  pattern.find_all(text, matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  std::size_t done = 0;
  for (const auto& [begin, end] : matches) {
    if (begin == end) continue;  // an empty match replaces nothing (HF skips them too)
    out.append(text, done, begin - done);
    out.append(content);
    done = end;
  }
  out.append(text, done, std::string_view::npos);
  return out;
}

void Normalizer::add_form(unicode::Form form) {
  steps_.push_back({Step::Kind::kForm, std::make_shared<const unicode::Normalization>(std::vector<unicode::Form>{form}),
                    nullptr, {}});
}

void Normalizer::add_replace(std::shared_ptr<const unicode::Regex> pattern, std::string content) {
  steps_.push_back({Step::Kind::kReplace, nullptr, std::move(pattern), std::move(content)});
}

void Normalizer::add_prepend(std::string prefix) {
  steps_.push_back({Step::Kind::kPrepend, nullptr, nullptr, std::move(prefix)});
}

std::string Normalizer::apply(std::string_view text) const {
  std::string current(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kForm:
        current = step.form->apply(current);
        break;
      case Step::Kind::kReplace:
        current = replace_all(*step.pattern, current, step.text);
        break;
      case Step::Kind::kPrepend:
        if (!current.empty()) current.insert(0, step.text);
        break;
    }
  }
  return current;
}

}  // namespace dflash::text
