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

struct Named {
  ChatFormat format;
  const char* name;
};
constexpr Named kFormats[] = {{ChatFormat::kChatMl, "chatml"}, {ChatFormat::kQwen3, "qwen3"}, {ChatFormat::kLlama3, "llama3"}};

// Python's str.isspace() over one code point: what Jinja's `trim` (str.strip)
// removes in the Llama-3 template.
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
  }
  if (!supervise)
    for (Unit& unit : units)
      for (Piece& piece : unit) piece.supervised = false;
  return units;
}

Unit generation_header(ChatFormat format) {
  switch (format) {
    case ChatFormat::kChatMl:
      return {{std::string(kImStart) + "assistant\n", false}};
    case ChatFormat::kQwen3:  // the non-thinking mode's prompt
      return {{std::string(kImStart) + "assistant\n<think>\n\n</think>\n\n", false}};
    case ChatFormat::kLlama3:
      return {{std::string(kStartHeader) + "assistant" + kEndHeader + "\n\n", false}};
  }
  return {};
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
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
  }
  return {};
}

ChatFormat detect_chat_format(const std::filesystem::path& model_dir) {
  const std::filesystem::path dir = std::filesystem::is_directory(model_dir) ? model_dir : model_dir.parent_path();
  const nlohmann::json tokenizer_config = read_json_file(dir / "tokenizer_config.json");
  std::string template_text;
  if (tokenizer_config.is_object() && tokenizer_config.contains("chat_template")) {
    const nlohmann::json& t = tokenizer_config["chat_template"];
    if (t.is_string()) template_text = t.get<std::string>();
    else if (t.is_array())  // named templates: [{"name": "default", "template": ...}, ...]
      for (const auto& entry : t)
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
            entry["template"].is_string())
          template_text = entry["template"].get<std::string>();
  }
  if (template_text.find(kStartHeader) != std::string::npos) return ChatFormat::kLlama3;
  if (template_text.find(kImStart) != std::string::npos)
    return template_text.find("<think>") != std::string::npos ? ChatFormat::kQwen3 : ChatFormat::kChatMl;
  const nlohmann::json config = read_json_file(dir / "config.json");
  const std::string model_type = config.is_object() ? config.value("model_type", std::string()) : std::string();
  if (model_type == "qwen3") return ChatFormat::kQwen3;
  if (model_type == "qwen2") return ChatFormat::kChatMl;
  throw std::invalid_argument(
      "cannot tell the chat format of " + dir.string() + ": " +
      (template_text.empty() ? "tokenizer_config.json has no chat_template"
                             : "its chat_template is neither ChatML nor Llama-3's") +
      (model_type.empty() ? " and there is no config.json model_type" : " and config.json model_type \"" + model_type + "\" is not one of qwen2, qwen3") +
      "; pass --chat-format (" + chat_format_names() + ")");
}

std::vector<Unit> render_conversation(ChatFormat format, const std::vector<Message>& messages) {
  return render(format, messages, /*supervise=*/true);
}

std::vector<Unit> render_generation_prompt(ChatFormat format, const std::vector<Message>& messages) {
  size_t end = messages.size();
  while (end > 0 && messages[end - 1].role == "assistant") --end;
  std::vector<Unit> units = render(format, std::vector<Message>(messages.begin(), messages.begin() + end), false);
  units.push_back(generation_header(format));
  return units;
}

}  // namespace dflash::prepare
