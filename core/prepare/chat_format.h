// Chat formats: how a conversation becomes the text a chat model was trained
// on, and which parts of it a drafter learns to predict (the assistant's
// words and the token that ends its turn). Written from the formats'
// definitions (the chat templates that ship with the models, in
// tokenizer_config.json or a GGUF file), checked token for token against
// them in tests.
//
//   chatml  Qwen2 / Qwen2.5 (and other ChatML models):
//           <|im_start|>{role}\n{content}<|im_end|>\n
//   qwen3   ChatML as Qwen3's template writes it: the assistant turns after
//           the last user message carry a <think>…</think> block (empty when
//           the message has no reasoning).
//   llama3  <|begin_of_text|> then <|start_header_id|>{role}<|end_header_id|>\n\n{content, stripped}<|eot_id|>
//   gemma3  <bos> then <start_of_turn>{user|model}\n{content, stripped}<end_of_turn>\n; a
//           system message opens the first user turn ("{system}\n\n"); user
//           and assistant must alternate from a user turn.
//   deepseek_v3  <｜begin▁of▁sentence｜>{system prompts} then <｜User｜>{content}
//           and <｜Assistant｜>{content}<｜end▁of▁sentence｜>; tool outputs in
//           <｜tool▁outputs▁begin｜>…<｜tool▁outputs▁end｜>, quirks included.
//   mistral Mistral-7B-Instruct (v0.1's template): <s> then [INST] {user} [/INST]{answer}</s>
//           and a space; no system message; user and assistant alternate.
//   llama2  Llama-2-chat: <s>[INST] {user, stripped} [/INST] {answer, stripped} </s>
//           per exchange; a system message opens the first user turn as
//           <<SYS>>\n{system}\n<</SYS>>\n\n; user and assistant alternate.
//   gptoss  gpt-oss's harmony: <|start|>system<|message|>{model identity, dates,
//           reasoning effort, channels}<|end|>, a system message as the
//           developer's instructions, <|start|>{role}<|message|>{content}<|end|>,
//           answers on <|channel|>final, the last one ending in <|return|> and
//           led by its reasoning on <|channel|>analysis.
//
// No format adds a default system prompt (Qwen2.5's template does); pass one
// explicitly where the model expects it. (gpt-oss's system message is not a
// prompt: its template always writes it, and so does gptoss.)
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dflash::prepare {

enum class ChatFormat { kChatMl, kQwen3, kLlama3, kGemma3, kDeepSeekV3, kMistral, kLlama2, kGptOss };

std::string_view chat_format_name(ChatFormat format);
std::optional<ChatFormat> chat_format_from_name(std::string_view name);
std::string chat_format_names();  // "chatml, qwen3, llama3, gemma3, deepseek_v3, mistral, llama2, gptoss", for messages

// The "Current date" gptoss writes in gpt-oss's system message. Its template
// writes the day of rendering; a fixed one keeps prepare's output the same
// from one day to the next (the date is context, not something learnt).
inline constexpr const char* kGptOssCurrentDate = "2025-08-05";

// The special tokens a format writes; a tokenizer must know each of them.
std::vector<std::string> chat_format_special_tokens(ChatFormat format);

// The format a model directory's chat template implies (tokenizer_config.json
// "chat_template"; config.json "model_type" only where there is no template).
// Throws std::invalid_argument naming what it read when neither tells, asking
// for --chat-format.
ChatFormat detect_chat_format(const std::filesystem::path& model_dir);

struct Message {
  std::string role;       // system, user, assistant or tool (gptoss: developer too)
  std::string content;
  std::optional<std::string> reasoning;  // an assistant's reasoning_content (qwen3, gptoss)
};

// A stretch of rendered text, supervised or not.
struct Piece {
  std::string text;
  bool supervised = false;
};

// The rendered text in units that each begin with a special token. A
// tokenizer splits text at special tokens before anything else, so each unit
// encodes on its own exactly as it does inside the whole text. (Beginning
// with one, not merely after one, matters to SentencePiece tokenizers whose
// pre-tokenizer adds "▁" only to the text's first stretch.)
using Unit = std::vector<Piece>;

// The whole conversation for training: the assistants' turns supervised
// (content and end-of-turn token; gptoss: all an answer's tokens after the
// <|start|>assistant that prompts it), everything else not. Throws
// std::invalid_argument on a role the format does not know, or on a
// conversation its template refuses (gemma3, mistral, llama2: turns that do
// not alternate).
std::vector<Unit> render_conversation(ChatFormat format, const std::vector<Message>& messages);

// A prompt for the target to answer: the conversation before its last
// assistant turn (the whole conversation when it ends with another role),
// then the header that opens an assistant turn. Nothing is supervised.
std::vector<Unit> render_generation_prompt(ChatFormat format, const std::vector<Message>& messages);

}  // namespace dflash::prepare
