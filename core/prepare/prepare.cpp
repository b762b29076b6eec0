#include "prepare/prepare.h"

#include "prepare/conversation.h"
#include "prepare/encode_units.h"
#include "generate/lines_file.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dflash::prepare {
namespace {

// Why a line is skipped; the report counts lines by these.
constexpr const char* kNotJson = "not JSON";
constexpr const char* kNulBytes = "NUL bytes (binary data)";
constexpr const char* kMalformed = "not a conversation or text";
constexpr const char* kNothingSupervised = "no assistant turn (nothing to learn)";
constexpr const char* kEmpty = "empty (no tokens)";

// A conversation met without a chat format: not the line's fault, so it
// stops the whole run rather than skipping the line.
struct NoChatFormat : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LineOutcome {
  std::string reason;  // empty: written
  std::string detail;
};

std::vector<Message> with_system(std::vector<Message> messages, const std::optional<std::string>& system) {
  if (system && (messages.empty() || messages.front().role != "system"))
    messages.insert(messages.begin(), Message{"system", *system, std::nullopt});
  return messages;
}

// One training or prompt line for `record`, or the reason there is none.
LineOutcome encode_record(const text::Tokenizer& tokenizer, const PrepareOptions& options, const Record& record,
                          nlohmann::json& line, PrepareReport& report) {
  Encoded encoded;
  if (record.text) {
    encoded = encode_text(tokenizer, *record.text);
  } else {
    if (!options.format) throw NoChatFormat(options.no_format_because);
    const std::vector<Message> messages = with_system(record.messages, options.system);
    encoded = encode_units(tokenizer, options.for_generate ? render_generation_prompt(*options.format, messages)
                                                           : render_conversation(*options.format, messages));
  }
  if (encoded.ids.empty()) return {kEmpty, "encodes to no tokens"};
  int64_t supervised = 0;
  for (uint8_t m : encoded.loss_mask) supervised += m;
  if (options.for_generate) {
    line = {{"prompt_ids", encoded.ids}};
  } else {
    if (supervised == 0) return {kNothingSupervised, "the conversation has no assistant turn"};
    line = {{"input_ids", encoded.ids}, {"loss_mask", encoded.loss_mask}};
  }
  report.tokens += static_cast<int64_t>(encoded.ids.size());
  report.supervised += options.for_generate ? 0 : supervised;
  ++(record.text ? report.texts : report.conversations);
  return {};
}

LineOutcome prepare_line(const text::Tokenizer& tokenizer, const PrepareOptions& options, const std::string& text,
                         nlohmann::json& line, PrepareReport& report) {
  if (text.find('\0') != std::string::npos) return {kNulBytes, "the line holds NUL bytes: is the file compressed?"};
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {kNotJson, "not valid JSON"};
  try {
    return encode_record(tokenizer, options, read_record(j), line, report);
  } catch (const std::invalid_argument& e) {
    return {kMalformed, e.what()};
  }
}

std::string skipped_summary(const PrepareReport& report) {
  std::string text;
  for (const auto& [reason, count] : report.skipped)
    text += std::string(text.empty() ? "" : ", ") + std::to_string(count) + " " + reason;
  return text;
}

}  // namespace

void check_tokenizer_has_format(const text::Tokenizer& tokenizer, ChatFormat format) {
  for (const std::string& token : chat_format_special_tokens(format))
    if (!tokenizer.token_to_id(token))
      throw std::invalid_argument("the tokenizer " + tokenizer.source().string() + " has no " + token + " token, which the " +
                                  std::string(chat_format_name(format)) +
                                  " chat format writes: is --chat-format right for this model? (formats: " +
                                  chat_format_names() + ")");
}

PrepareReport prepare_file(const text::Tokenizer& tokenizer, const PrepareOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::ifstream in(options.input, std::ios::binary);
  if (!in) throw std::runtime_error(options.input.string() + ": cannot be read");
  PrepareReport report;
  generate::LinesFile out(options.output.string());
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    ++report.lines;
    nlohmann::json line;
    LineOutcome outcome;
    try {
      outcome = prepare_line(tokenizer, options, text, line, report);
    } catch (const NoChatFormat& e) {
      throw std::invalid_argument(options.input.string() + ":" + std::to_string(number) + " is a conversation, and " +
                                  e.what());
    }
    if (outcome.reason.empty()) {
      out.add(static_cast<size_t>(report.written), line.dump());
      ++report.written;
      continue;
    }
    ++report.skipped[outcome.reason];
    if (static_cast<int64_t>(report.bad_lines.size()) < options.log_bad_lines)
      report.bad_lines.push_back(options.input.string() + ":" + std::to_string(number) + ": " + outcome.detail);
  }
  if (in.bad()) throw std::runtime_error(options.input.string() + ": read error");
  if (report.written == 0) {
    std::string why = report.lines == 0 ? "it holds no lines" : "every line was skipped: " + skipped_summary(report);
    for (const std::string& bad : report.bad_lines) why += "\n  " + bad;
    throw std::runtime_error(options.input.string() + ": nothing to write, " + why + "; " + options.output.string() +
                             " is unchanged");
  }
  out.commit(static_cast<size_t>(report.written));
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

std::string format_report(const PrepareReport& report, const PrepareOptions& options) {
  std::ostringstream out;
  out << options.output.string() << ": " << report.written << " " << (options.for_generate ? "prompts" : "training lines")
      << " (" << report.conversations << " conversations, " << report.texts << " texts) from " << report.lines
      << " input lines, " << report.tokens << " tokens";
  if (!options.for_generate) out << " (" << report.supervised << " supervised)";
  if (options.format) out << ", format " << chat_format_name(*options.format);
  char rate[64];
  std::snprintf(rate, sizeof rate, ", %.1f s", report.seconds);
  out << rate;
  if (!report.skipped.empty()) out << "\nskipped: " << skipped_summary(report);
  for (const std::string& bad : report.bad_lines) out << "\n  " << bad;
  return out.str();
}

}  // namespace dflash::prepare
