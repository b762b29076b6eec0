#include "prepare/conversation.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace dflash::prepare {
namespace {

using nlohmann::json;

std::string at_message(const char* key, size_t i) { return std::string(key) + "[" + std::to_string(i) + "]"; }

// A content: a string, or a list of parts of which the "text" ones are kept.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array()) throw std::invalid_argument(where + ".content must be a string or a list of parts");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const std::string at = where + ".content[" + std::to_string(k) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw std::invalid_argument(at + " must be an object with a \"type\"");
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      throw std::invalid_argument(at + " is a \"" + type + "\" part: only text parts can be tokenized");
    if (!part.contains("text") || !part["text"].is_string()) throw std::invalid_argument(at + ".text must be a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

std::vector<Message> openai_messages(const json& messages) {
  if (!messages.is_array() || messages.empty()) throw std::invalid_argument("\"messages\" must be a non-empty list");
  std::vector<Message> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = at_message("messages", i);
    if (!m.is_object()) throw std::invalid_argument(where + " must be an object with \"role\" and \"content\"");
    if (!m.contains("role") || !m["role"].is_string()) throw std::invalid_argument(where + ".role must be a string");
    if (m.contains("tool_calls") && !m["tool_calls"].is_null() && !m["tool_calls"].empty())
      throw std::invalid_argument(where + " has tool_calls, which prepare does not render; drop them or the line");
    Message message{m["role"].get<std::string>(), content_text(m.value("content", json()), where), std::nullopt};
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      message.reasoning = m["reasoning_content"].get<std::string>();
    out.push_back(std::move(message));
  }
  return out;
}

std::vector<Message> sharegpt_messages(const json& turns) {
  if (!turns.is_array() || turns.empty()) throw std::invalid_argument("\"conversations\" must be a non-empty list");
  std::vector<Message> out;
  for (size_t i = 0; i < turns.size(); ++i) {
    const json& t = turns[i];
    const std::string where = at_message("conversations", i);
    if (!t.is_object() || !t.contains("from") || !t["from"].is_string() || !t.contains("value") || !t["value"].is_string())
      throw std::invalid_argument(where + " must be an object with string \"from\" and \"value\"");
    const std::string from = t["from"].get<std::string>();
    std::string role = from == "human" || from == "user"        ? "user"
                       : from == "gpt" || from == "assistant"   ? "assistant"
                       : from == "system"                        ? "system"
                       : from == "tool" || from == "observation" ? "tool"
                                                                 : "";
    if (role.empty())
      throw std::invalid_argument(where + ".from \"" + from + "\" is none of human, gpt, system, tool (or user, assistant)");
    out.push_back({role, t["value"].get<std::string>(), std::nullopt});
  }
  return out;
}

}  // namespace

Record read_record(const json& line) {
  if (!line.is_object()) throw std::invalid_argument("not a JSON object");
  Record record;
  if (line.contains("messages")) {
    record.messages = openai_messages(line["messages"]);
  } else if (line.contains("conversations")) {
    record.messages = sharegpt_messages(line["conversations"]);
  } else if (line.contains("text")) {
    if (!line["text"].is_string()) throw std::invalid_argument("\"text\" must be a string");
    record.text = line["text"].get<std::string>();
  } else {
    throw std::invalid_argument("needs \"messages\" (OpenAI-style), \"conversations\" (ShareGPT) or \"text\"");
  }
  return record;
}

}  // namespace dflash::prepare
