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
constexpr const char* kSentenceStart = "<s>";
constexpr const char* kSentenceEnd = "</s>";
constexpr const char* kStart = "<|start|>";
constexpr const char* kMessage = "<|message|>";
constexpr const char* kEnd = "<|end|>";
constexpr const char* kChannel = "<|channel|>";
constexpr const char* kReturn = "<|return|>";

struct Named {
  ChatFormat format;
  const char* name;
};
constexpr Named kFormats[] = {{ChatFormat::kChatMl, "chatml"},
                              {ChatFormat::kQwen3, "qwen3"},
                              {ChatFormat::kLlama3, "llama3"},
                              {ChatFormat::kGemma3, "gemma3"},
                              {ChatFormat::kDeepSeekV3, "deepseek_v3"},
                              {ChatFormat::kMistral, "mistral"},
                              {ChatFormat::kLlama2, "llama2"},
                              {ChatFormat::kGptOss, "gptoss"}};

// config.json model_types whose chat format is known, for folders without a
// chat template. Not "mistral" nor "llama": each covers models of different
// formats (Mistral v0.1 and v0.3, Zephyr; Llama 2 and 3).
struct ModelType {
  const char* model_type;
  ChatFormat format;
};
constexpr ModelType kModelTypes[] = {{"qwen2", ChatFormat::kChatMl},
                                     {"qwen3", ChatFormat::kQwen3},
                                     {"gemma3", ChatFormat::kGemma3},
                                     {"gemma3_text", ChatFormat::kGemma3},
                                     {"deepseek_v3", ChatFormat::kDeepSeekV3},
                                     {"gpt_oss", ChatFormat::kGptOss}};

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

// The templates of Gemma 3, Mistral and Llama 2 take user and assistant
// turns alternating from a user turn (after one leading system message, where
// the format has a place for it: the first user turn) and raise on other
// orders. A tool or later system message in an assistant's place they write
// as a turn of that role (Gemma 3) or drop (Llama 2): refused here as well.
// takes_system: the format writes a first system message (Mistral's does not).
void check_alternating_turns(const std::vector<Message>& messages, size_t first, ChatFormat format,
                             const char* whose_template, bool takes_system) {
  const std::string name(chat_format_name(format));
  if (first == 1 && messages.size() == 1)
    throw std::invalid_argument(name + " writes a system message into the first user turn, and the conversation has none");
  for (size_t i = first; i < messages.size(); ++i) {
    const Message& m = messages[i];
    if (m.role == "system")
      throw std::invalid_argument(
          takes_system
              ? name + " takes a system message only as the first message (it opens the first user turn); merge the "
                       "later one into it"
              : name + " has no system message (" + whose_template + " refuses one); merge it into the first user message");
    if (takes_system) require_role(m, {"system", "user", "assistant"}, format);
    else require_role(m, {"user", "assistant"}, format);
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    if (m.role != expected)
      throw std::invalid_argument(
          name + " needs user and assistant turns to alternate, starting with user (" + whose_template +
          " refuses others), but " +
          (i == first ? std::string("the first turn is the assistant's") : "two " + m.role + " messages follow each other"));
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
  check_alternating_turns(messages, first_turn, ChatFormat::kGemma3, "Gemma 3's template", /*takes_system=*/true);
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

// --- Mistral ------------------------------------------------------------------

// Mistral-7B-Instruct's template: <s> once, [INST] {user} [/INST] (the
// brackets are plain text in its vocabulary), the answer straight after, then
// </s> and a space, the last answer's included. Nothing is stripped.
//
// The space after </s> and the next [INST] are one stretch of text, encoded
// together, so a unit begins at </s> rather than after it: </s> is the
// previous answer's end (learnt), the space and the next user turn are not.
std::vector<Unit> mistral_units(const std::vector<Message>& messages) {
  check_alternating_turns(messages, 0, ChatFormat::kMistral, "Mistral-7B-Instruct's template", /*takes_system=*/false);
  std::vector<Unit> units = {{{kSentenceStart, false}}};
  for (const Message& m : messages) {
    if (m.role == "user") {
      units.back().push_back({"[INST] " + m.content + " [/INST]", false});
    } else {
      units.back().push_back({m.content, true});
      units.push_back({{kSentenceEnd, true}, {" ", false}});
    }
  }
  return units;
}

// --- Llama 2 ------------------------------------------------------------------

// Llama-2-chat's template: each exchange is <s>[INST] {user} [/INST] {answer} </s>,
// user and answer stripped; a system message goes inside the first user turn,
// which is stripped as a whole (the system text's own leading whitespace is
// kept behind <<SYS>>, the user text's leading whitespace too).
//
// The space before the answer is the answer's: SentencePiece writes it as the
// "▁" of the answer's first token, which the model produces after [/INST].
std::vector<Unit> llama2_units(const std::vector<Message>& messages) {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first_turn = has_system ? 1 : 0;
  check_alternating_turns(messages, first_turn, ChatFormat::kLlama2, "Llama 2's template", /*takes_system=*/true);
  std::vector<Unit> units;
  for (size_t i = first_turn; i < messages.size(); ++i) {
    const Message& m = messages[i];
    if (m.role == "user") {
      const std::string content =
          i == first_turn && has_system ? "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + m.content : m.content;
      units.push_back({{kSentenceStart + std::string("[INST] ") + python_strip(content) + " [/INST]", false}});
    } else {
      units.back().push_back({" " + python_strip(m.content) + " " + kSentenceEnd, true});
    }
  }
  return units;
}

// --- gpt-oss (harmony) ----------------------------------------------------------

// The system message gpt-oss's template writes before every conversation, at
// its defaults: no model_identity, reasoning_effort or tools given.
std::string gptoss_system_message() {
  return std::string(kStart) + "system" + kMessage +
         "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: " +
         kGptOssCurrentDate +
         "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
         "message." +
         kEnd;
}

// The template refuses an assistant message that writes harmony's channel
// headers itself: the analysis belongs in reasoning_content, the answer in content.
void check_gptoss_answer(const Message& m) {
  for (const std::string* text : {&m.content, m.reasoning ? &*m.reasoning : nullptr}) {
    if (text == nullptr) continue;
    for (const char* header : {"<|channel|>analysis<|message|>", "<|channel|>final<|message|>"})
      if (text->find(header) != std::string::npos)
        throw std::invalid_argument(std::string("an assistant's ") + (text == &m.content ? "content" : "reasoning") +
                                    " holds " + header + ", which gpt-oss's template refuses: give the analysis as "
                                    "reasoning_content and the answer as content, without channel tokens");
  }
}

// An answer: <|start|>assistant prompts it; the model writes the rest, the
// <|channel|>final<|message|> header included, so all of it is learnt. The
// conversation's last answer ends with <|return|>, the end of generation, and
// is led by its reasoning on the analysis channel; earlier answers end with
// <|end|> and lose their reasoning, as in gpt-oss's chat history.
void gptoss_answer(const Message& m, bool last, std::vector<Unit>& units) {
  check_gptoss_answer(m);
  const std::string assistant = std::string(kStart) + "assistant";
  if (last && m.reasoning) {
    units.push_back({{assistant, false}, {kChannel + std::string("analysis") + kMessage + *m.reasoning + kEnd, true}});
    units.push_back({{assistant + kChannel + "final" + kMessage + m.content + kReturn, true}});
  } else {
    units.push_back(
        {{assistant, false}, {kChannel + std::string("final") + kMessage + m.content + (last ? kReturn : kEnd), true}});
  }
}

// gpt-oss's template: its system message, then a first system (or developer)
// message as the developer's "# Instructions", then the turns. A later system
// or developer message has no place in it and is dropped, as the template
// drops it (a server rendering the target's prompts does the same). A tool
// output it writes only after the assistant's tool call, which prepare does
// not take (messages with tool_calls are refused), so it raises.
std::vector<Unit> gptoss_units(const std::vector<Message>& messages) {
  std::vector<Unit> units = {{{gptoss_system_message(), false}}};
  size_t first_turn = 0;
  if (!messages.empty() && (messages[0].role == "system" || messages[0].role == "developer")) {
    if (!messages[0].content.empty())  // the template writes no developer message for an empty one
      units.push_back({{std::string(kStart) + "developer" + kMessage + "# Instructions\n\n" + messages[0].content +
                            "\n\n" + kEnd,
                        false}});
    first_turn = 1;
  }
  for (size_t i = first_turn; i < messages.size(); ++i) {
    const Message& m = messages[i];
    require_role(m, {"system", "developer", "user", "assistant", "tool"}, ChatFormat::kGptOss);
    if (m.role == "tool")
      throw std::invalid_argument(
          "gptoss writes a tool's output only after the assistant's tool call (gpt-oss's template refuses others), and "
          "prepare takes no tool calls");
    if (m.role == "user") units.push_back({{std::string(kStart) + "user" + kMessage + m.content + kEnd, false}});
    else if (m.role == "assistant") gptoss_answer(m, i + 1 == messages.size(), units);
  }
  return units;
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
    case ChatFormat::kMistral:
      units = mistral_units(messages);
      break;
    case ChatFormat::kLlama2:
      units = llama2_units(messages);
      break;
    case ChatFormat::kGptOss:
      units = gptoss_units(messages);
      break;
  }
  if (!supervise)
    for (Unit& unit : units)
      for (Piece& piece : unit) piece.supervised = false;
  return units;
}

// What opens the assistant's turn after `messages`; none where the
// conversation's own ending already does (DeepSeek-V3 after tool outputs, and
// Mistral's and Llama 2's [/INST], after which the answer follows directly).
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
    case ChatFormat::kMistral:
    case ChatFormat::kLlama2:
      return std::nullopt;
    case ChatFormat::kGptOss:  // the model writes the channel itself
      return Unit{{std::string(kStart) + "assistant", false}};
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

// Mistral's later templates (v0.2's revision, v0.3's, Mixtral-8x22B's) take a
// system message, and the newest write [/INST] with no space before it; each
// renders differently from v0.1's, which mistral writes.
std::optional<ChatFormat> mistral_template(const std::string& text, const std::filesystem::path& dir) {
  if (text.find("system") != std::string::npos)
    throw cannot_tell(dir, "its chat_template is Mistral's but takes a system message (as Mistral's templates after "
                           "v0.1's do), which mistral does not write");
  if (text.find(" [/INST]") == std::string::npos)
    throw cannot_tell(dir, "its chat_template is Mistral's but writes [/INST] without the space before it (as "
                           "Mistral v0.3's and Mixtral-8x22B's do), which mistral does not write");
  return ChatFormat::kMistral;
}

// The format a chat template writes, told by a token only that format
// writes; none when no format's token is there. A DeepSeek template that
// handles </think> (DeepSeek-R1's and its distills', V3.1's) cuts answers at
// </think>, which deepseek_v3 does not: it is not taken for V3's. [INST] is
// Llama 2's and Mistral's, Llama 2's with <<SYS>>.
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
  if (has(kChannel)) return ChatFormat::kGptOss;
  if (has("[INST]")) return has("<<SYS>>") ? ChatFormat::kLlama2 : mistral_template(text, dir);
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
    case ChatFormat::kMistral:
    case ChatFormat::kLlama2:  // [INST] and <<SYS>> are plain text
      return {kSentenceStart, kSentenceEnd};
    case ChatFormat::kGptOss:
      return {kStart, kMessage, kEnd, kChannel, kReturn};
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
                               std::string(kAssistant) + ", <|channel|>, [INST]");
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
