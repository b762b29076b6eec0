#include "prepare/chat_format.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <stdexcept>

namespace dflash::prepare {
namespace {

constexpr const char* kImStart = "<|im_start|>";
constexpr const char* kImEnd = "<|im_end|>";
constexpr const char* kBeginOfText = "<|begin_of_text|>";
constexpr const char* kStartHeader = "<|start_header_id|>";
constexpr const char* kEndHeader = "<|end_header_id|>";
constexpr const char* kEndOfTurn = "<|eot_id|>";
constexpr const char* kBos = "<bos>";
constexpr const char* kStartOfTurn = "<start_of_turn>";
constexpr const char* kGemmaEndOfTurn = "<end_of_turn>";
constexpr const char* kBeginOfSentence = "<｜begin▁of▁sentence｜>";
constexpr const char* kEndOfSentence = "<｜end▁of▁sentence｜>";
constexpr const char* kUser = "<｜User｜>";
constexpr const char* kAssistant = "<｜Assistant｜>";
constexpr const char* kToolOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr const char* kToolOutputBegin = "<｜tool▁output▁begin｜>";
constexpr const char* kToolOutputEnd = "<｜tool▁output▁end｜>";
constexpr const char* kToolOutputsEnd = "<｜tool▁outputs▁end｜>";

struct Named {
  ChatFormat format;
  const char* name;
};
constexpr Named kFormats[] = {{ChatFormat::kChatMl, "chatml"},
                              {ChatFormat::kQwen3, "qwen3"},
                              {ChatFormat::kLlama3, "llama3"},
                              {ChatFormat::kGemma3, "gemma3"},
                              {ChatFormat::kDeepSeekV3, "deepseek_v3"}};

// config.json model_types whose chat format is known, for folders without a
// chat template.
struct ModelType {
  const char* model_type;
  ChatFormat format;
};
constexpr ModelType kModelTypes[] = {{"qwen2", ChatFormat::kChatMl},
                                     {"qwen3", ChatFormat::kQwen3},
                                     {"gemma3", ChatFormat::kGemma3},
                                     {"gemma3_text", ChatFormat::kGemma3},
                                     {"deepseek_v3", ChatFormat::kDeepSeekV3}};

// Python's str.isspace() over one code point: what Jinja's `trim` (str.strip)
// removes in the Llama-3 and Gemma 3 templates.
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point starting at text[i] and its length in bytes; an ill-formed
// byte counts as one non-space character.
std::pair<char32_t, size_t> code_point_at(std::string_view text, size_t i) {
  const auto b = static_cast<unsigned char>(text[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > text.size()) return {0xFFFD, 1};
  char32_t c = n == 1 ? b : b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto cont = static_cast<unsigned char>(text[i + k]);
    if ((cont & 0xC0) != 0x80) return {0xFFFD, 1};
    c = (c << 6) | (cont & 0x3F);
  }
  return {c, n};
}

std::string python_strip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    const auto [c, n] = code_point_at(text, begin);
    if (!python_space(c)) break;
    begin += n;
  }
  size_t end = begin, kept = begin;  // end of the last non-space character
  while (end < text.size()) {
    const auto [c, n] = code_point_at(text, end);
    end += n;
    if (!python_space(c)) kept = end;
  }
  return std::string(text.substr(begin, kept - begin));
}

std::string strip_newlines(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  if (left)
    while (begin < end && text[begin] == '\n') ++begin;
  if (right)
    while (end > begin && text[end - 1] == '\n') --end;
  return std::string(text.substr(begin, end - begin));
}

void require_role(const Message& m, std::initializer_list<const char*> roles, ChatFormat format) {
  for (const char* role : roles)
    if (m.role == role) return;
  std::string known;
  for (const char* role : roles) known += std::string(known.empty() ? "" : ", ") + role;
  throw std::invalid_argument("role \"" + m.role + "\" is not one the " + std::string(chat_format_name(format)) +
                              " format writes (" + known + ")");
}

// --- ChatML (Qwen2, Qwen2.5) ------------------------------------------------

Unit chatml_turn(const Message& m) {
  const bool assistant = m.role == "assistant";
  return {{kImStart + m.role + "\n", false}, {m.content + kImEnd, assistant}, {"\n", false}};
}

// --- Qwen3 --------------------------------------------------------------------

bool is_tool_response(const std::string& content) {
  const std::string open = "<tool_response>", close = "</tool_response>";
  return content.size() >= open.size() + close.size() && content.compare(0, open.size(), open) == 0 &&
         content.compare(content.size() - close.size(), close.size(), close) == 0;
}

// The index of the last user message that is a real query (not a tool
// response written as a user turn); the template's ns.last_query_index.
size_t last_query_index(const std::vector<Message>& messages) {
  for (size_t i = messages.size(); i-- > 0;)
    if (messages[i].role == "user" && !is_tool_response(messages[i].content)) return i;
  return messages.size() - 1;
}

// An assistant message's reasoning and answer, as the template splits them.
std::pair<std::string, std::string> qwen3_reasoning_and_answer(const Message& m) {
  if (m.reasoning) return {*m.reasoning, m.content};
  const std::string close = "</think>";
  const size_t end = m.content.rfind(close);
  if (end == std::string::npos) return {"", m.content};
  const std::string answer = strip_newlines(std::string_view(m.content).substr(end + close.size()), true, false);
  std::string reasoning = strip_newlines(std::string_view(m.content).substr(0, m.content.find(close)), false, true);
  const size_t open = reasoning.rfind("<think>");
  if (open != std::string::npos) reasoning = reasoning.substr(open + 7);
  return {strip_newlines(reasoning, true, false), answer};
}

std::vector<Unit> qwen3_units(const std::vector<Message>& messages, bool supervise) {
  std::vector<Unit> units;
  const size_t last_query = last_query_index(messages);
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    require_role(m, {"system", "user", "assistant", "tool"}, ChatFormat::kQwen3);
    if (m.role == "user" || m.role == "system") {
      units.push_back({{kImStart + m.role + "\n" + m.content + kImEnd + "\n", false}});
    } else if (m.role == "assistant") {
      const auto [reasoning, answer] = qwen3_reasoning_and_answer(m);
      const std::string stripped = strip_newlines(reasoning, true, true);
      Unit unit = {{std::string(kImStart) + "assistant\n", false}};
      const bool last = i + 1 == messages.size();
      if (i > last_query && (last || !reasoning.empty())) {
        // An empty <think> block is what the generation prompt of the
        // non-thinking mode writes: part of the header, not learnt.
        const bool thought = !stripped.empty();
        unit.push_back({"<think>\n" + stripped + "\n</think>\n\n", supervise && thought});
        unit.push_back({strip_newlines(answer, true, false) + kImEnd, supervise});
      } else {
        unit.push_back({answer + kImEnd, supervise});
      }
      unit.push_back({"\n", false});
      units.push_back(std::move(unit));
    } else {  // tool: consecutive responses share one user turn
      const bool first = i == 0 || messages[i - 1].role != "tool";
      const bool end = i + 1 == messages.size() || messages[i + 1].role != "tool";
      std::string text = std::string(first ? std::string(kImStart) + "user" : "") + "\n<tool_response>\n" + m.content +
                         "\n</tool_response>" + (end ? std::string(kImEnd) + "\n" : "");
      if (first) units.push_back({{text, false}});
      else units.back().push_back({text, false});
    }
  }
  return units;
}

// --- Llama 3 --------------------------------------------------------------------

Unit llama3_turn(const Message& m) {
  return {{std::string(kStartHeader) + m.role + kEndHeader + "\n\n", false},
          {python_strip(m.content) + kEndOfTurn, m.role == "assistant"}};
}

// --- Gemma 3 --------------------------------------------------------------------

// Gemma 3's template takes an optional system message first, then user and
// assistant turns alternating from a user turn, and raises on other orders.
// A tool or later system message in an assistant's place it writes as a turn
// of that role, which Gemma was never tuned with: refused here as well.
void check_gemma3_turns(const std::vector<Message>& messages, size_t first) {
  if (first == 1 && messages.size() == 1)
    throw std::invalid_argument("gemma3 writes a system message into the first user turn, and the conversation has none");
  for (size_t i = first; i < messages.size(); ++i) {
    const Message& m = messages[i];
    require_role(m, {"system", "user", "assistant"}, ChatFormat::kGemma3);
    if (m.role == "system")
      throw std::invalid_argument(
          "gemma3 takes a system message only as the first message (it opens the first user turn); merge the later one "
          "into it");
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    if (m.role != expected)
      throw std::invalid_argument(
          std::string("gemma3 needs user and assistant turns to alternate, starting with user (Gemma 3's template "
                      "refuses others), but ") +
          (i == first ? "the first turn is the assistant's" : "two " + m.role + " messages follow each other"));
  }
}

Unit gemma3_turn(const Message& m, const std::string& prefix) {
  if (m.role == "user")
    return {{kStartOfTurn + std::string("user\n") + prefix + python_strip(m.content) + kGemmaEndOfTurn + "\n", false}};
  return {{kStartOfTurn + std::string("model\n"), false},
          {python_strip(m.content) + kGemmaEndOfTurn, true},
          {"\n", false}};
}

std::vector<Unit> gemma3_units(const std::vector<Message>& messages) {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first_turn = has_system ? 1 : 0;
  check_gemma3_turns(messages, first_turn);
  // Gemma has no system turn: the system text, unstripped, opens the first
  // user turn, before that turn's stripped content.
  const std::string system_prefix = has_system ? messages[0].content + "\n\n" : "";
  std::vector<Unit> units = {{{kBos, false}}};
  for (size_t i = first_turn; i < messages.size(); ++i)
    units.push_back(gemma3_turn(messages[i], i == first_turn ? system_prefix : ""));
  return units;
}

// --- DeepSeek-V3 ---------------------------------------------------------------

// DeepSeek-V3's template, message by message. Its quirks are kept, because a
// server renders the target's prompts with the same template: every system
// message goes first, joined by blank lines; an answer after tool outputs
// opens with <｜tool▁outputs▁end｜> instead of <｜Assistant｜>; only the very
// first tool output of a conversation opens <｜tool▁outputs▁begin｜> (later
// ones follow "\n"), and outputs a user message follows are never closed.
std::vector<Unit> deepseek_v3_units(const std::vector<Message>& messages) {
  std::string system_prompt;
  bool first_system = true;
  for (const Message& m : messages) {
    require_role(m, {"system", "user", "assistant", "tool"}, ChatFormat::kDeepSeekV3);
    if (m.role != "system") continue;
    system_prompt += (first_system ? "" : "\n\n") + m.content;
    first_system = false;
  }
  std::vector<Unit> units = {{{kBeginOfSentence + system_prompt, false}}};
  bool in_tool_outputs = false;  // the template's ns.is_tool
  bool had_tool_output = false;  // not ns.is_output_first, which it never resets
  for (const Message& m : messages) {
    if (m.role == "user") {
      in_tool_outputs = false;
      units.push_back({{kUser + m.content, false}});
    } else if (m.role == "assistant") {
      units.push_back({{in_tool_outputs ? kToolOutputsEnd : kAssistant, false}, {m.content + kEndOfSentence, true}});
      in_tool_outputs = false;
    } else if (m.role == "tool") {
      const std::string output = kToolOutputBegin + m.content + kToolOutputEnd;
      // A unit begins with a token the tokenizer splits at, which "\n" is not.
      if (had_tool_output) units.back().push_back({"\n" + output, false});
      else units.push_back({{kToolOutputsBegin + output, false}});
      in_tool_outputs = had_tool_output = true;
    }
  }
  if (in_tool_outputs) units.push_back({{kToolOutputsEnd, false}});
  return units;
}

// After tool outputs the template's generation prompt is the
// <｜tool▁outputs▁end｜> that closes them, which the conversation already ends with.
bool deepseek_v3_ends_in_tool_outputs(const std::vector<Message>& messages) {
  for (size_t i = messages.size(); i-- > 0;)
    if (messages[i].role != "system") return messages[i].role == "tool";
  return false;
}

// --- shared -------------------------------------------------------------------

std::vector<Unit> render(ChatFormat format, const std::vector<Message>& messages, bool supervise) {
  std::vector<Unit> units;
  switch (format) {
    case ChatFormat::kChatMl:
      for (const Message& m : messages) {
        require_role(m, {"system", "user", "assistant", "tool"}, format);
        units.push_back(chatml_turn(m));
      }
      break;
    case ChatFormat::kQwen3:
      units = qwen3_units(messages, supervise);
      break;
    case ChatFormat::kLlama3:
      units.push_back({{kBeginOfText, false}});
      for (const Message& m : messages) {
        require_role(m, {"system", "user", "assistant", "ipython", "tool"}, format);
        units.push_back(llama3_turn(m));
      }
      break;
    case ChatFormat::kGemma3:
      units = gemma3_units(messages);
      break;
    case ChatFormat::kDeepSeekV3:
      units = deepseek_v3_units(messages);
      break;
  }
  if (!supervise)
    for (Unit& unit : units)
      for (Piece& piece : unit) piece.supervised = false;
  return units;
}

// What opens the assistant's turn after `messages`; none where the
// conversation's own ending already does (DeepSeek-V3 after tool outputs).
std::optional<Unit> generation_header(ChatFormat format, const std::vector<Message>& messages) {
  switch (format) {
    case ChatFormat::kChatMl:
      return Unit{{std::string(kImStart) + "assistant\n", false}};
    case ChatFormat::kQwen3:  // the non-thinking mode's prompt
      return Unit{{std::string(kImStart) + "assistant\n<think>\n\n</think>\n\n", false}};
    case ChatFormat::kLlama3:
      return Unit{{std::string(kStartHeader) + "assistant" + kEndHeader + "\n\n", false}};
    case ChatFormat::kGemma3:
      return Unit{{std::string(kStartOfTurn) + "model\n", false}};
    case ChatFormat::kDeepSeekV3:
      if (deepseek_v3_ends_in_tool_outputs(messages)) return std::nullopt;
      return Unit{{kAssistant, false}};
  }
  return std::nullopt;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

std::invalid_argument cannot_tell(const std::filesystem::path& dir, const std::string& why) {
  return std::invalid_argument("cannot tell the chat format of " + dir.string() + ": " + why + "; pass --chat-format (" +
                               chat_format_names() + ")");
}

// tokenizer_config.json's "chat_template" ("" when there is none): a string,
// or named templates of which "default" is the chat one.
std::string read_chat_template(const std::filesystem::path& dir) {
  const nlohmann::json tokenizer_config = read_json_file(dir / "tokenizer_config.json");
  if (!tokenizer_config.is_object() || !tokenizer_config.contains("chat_template")) return "";
  const nlohmann::json& t = tokenizer_config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())  // [{"name": "default", "template": ...}, ...]
    for (const auto& entry : t)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
  return "";
}

// The format a chat template writes, told by a token only that format
// writes; none when no format's token is there. A DeepSeek template that
// handles </think> (DeepSeek-R1's and its distills', V3.1's) cuts answers at
// </think>, which deepseek_v3 does not: it is not taken for V3's.
std::optional<ChatFormat> format_of_template(const std::string& text, const std::filesystem::path& dir) {
  const auto has = [&](const char* token) { return text.find(token) != std::string::npos; };
  if (has(kStartHeader)) return ChatFormat::kLlama3;
  if (has(kImStart)) return has("<think>") ? ChatFormat::kQwen3 : ChatFormat::kChatMl;
  if (has(kStartOfTurn)) return ChatFormat::kGemma3;
  if (has(kAssistant)) {
    if (has("</think>"))
      throw cannot_tell(dir, "its chat_template is DeepSeek's but handles </think> (as DeepSeek-R1's and V3.1's do), "
                             "which no format writes");
    return ChatFormat::kDeepSeekV3;
  }
  return std::nullopt;
}

}  // namespace

std::string_view chat_format_name(ChatFormat format) {
  for (const Named& f : kFormats)
    if (f.format == format) return f.name;
  return "unknown";
}

std::optional<ChatFormat> chat_format_from_name(std::string_view name) {
  for (const Named& f : kFormats)
    if (name == f.name) return f.format;
  return std::nullopt;
}

std::string chat_format_names() {
  std::string names;
  for (const Named& f : kFormats) names += std::string(names.empty() ? "" : ", ") + f.name;
  return names;
}

std::vector<std::string> chat_format_special_tokens(ChatFormat format) {
  switch (format) {
    case ChatFormat::kChatMl:
      return {kImStart, kImEnd};
    case ChatFormat::kQwen3:
      return {kImStart, kImEnd, "<think>", "</think>"};
    case ChatFormat::kLlama3:
      return {kBeginOfText, kStartHeader, kEndHeader, kEndOfTurn};
    case ChatFormat::kGemma3:
      return {kBos, kStartOfTurn, kGemmaEndOfTurn};
    case ChatFormat::kDeepSeekV3:
      return {kBeginOfSentence, kEndOfSentence,   kUser,          kAssistant,
              kToolOutputsBegin, kToolOutputBegin, kToolOutputEnd, kToolOutputsEnd};
  }
  return {};
}

ChatFormat detect_chat_format(const std::filesystem::path& model_dir) {
  const std::filesystem::path dir = std::filesystem::is_directory(model_dir) ? model_dir : model_dir.parent_path();
  // The template is what the model was tuned with; model_type only stands in
  // for it where there is none, since one model_type covers models with
  // different templates (DeepSeek-R1 is a deepseek_v3, its distills qwen2).
  const std::string chat_template = read_chat_template(dir);
  if (!chat_template.empty()) {
    if (const auto format = format_of_template(chat_template, dir)) return *format;
    throw cannot_tell(dir, "its chat_template writes none of <|im_start|>, <|start_header_id|>, <start_of_turn>, " +
                               std::string(kAssistant));
  }
  const nlohmann::json config = read_json_file(dir / "config.json");
  const std::string model_type = config.is_object() ? config.value("model_type", std::string()) : std::string();
  std::string known;
  for (const ModelType& t : kModelTypes) {
    if (model_type == t.model_type) return t.format;
    known += std::string(known.empty() ? "" : ", ") + t.model_type;
  }
  throw cannot_tell(dir, "tokenizer_config.json has no chat_template and " +
                             (model_type.empty() ? std::string("there is no config.json model_type")
                                                 : "config.json model_type \"" + model_type + "\" is none of " + known));
}

std::vector<Unit> render_conversation(ChatFormat format, const std::vector<Message>& messages) {
  return render(format, messages, /*supervise=*/true);
}

std::vector<Unit> render_generation_prompt(ChatFormat format, const std::vector<Message>& messages) {
  size_t end = messages.size();
  while (end > 0 && messages[end - 1].role == "assistant") --end;
  const std::vector<Message> before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(end));
  std::vector<Unit> units = render(format, before, false);
  if (auto header = generation_header(format, before)) units.push_back(std::move(*header));
  return units;
}

}  // namespace dflash::prepare
