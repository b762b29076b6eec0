// What the loader refuses, and how: every bad file gives a TokenizerError
// naming the file, the JSON key and what to do, never a crash. Then fuzzing:
// mutated tokenizer.json files (seeded), and random bytes to encode.
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "text/utf8.h"
#include "core/text/tiny_tokenizer.h"

#include "support/expect.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <random>
#include <typeinfo>

#include <sys/stat.h>
#include <unistd.h>

using dflash::test::TempDir;
using dflash::test::tiny_tokenizer_json;
using dflash::test::write_json;
using dflash::test::write_text;
using dflash::text::Tokenizer;
using dflash::text::TokenizerError;
using Ids = std::vector<int64_t>;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The error loading `path` gives; the test fails if it loads or throws anything else.
TokenizerError refusal(const fs::path& path) {
  try {
    Tokenizer::load(path);
  } catch (const TokenizerError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a TokenizerError: " << e.what();
    return TokenizerError(path, "", "");
  }
  ADD_FAILURE() << path << " loaded";
  return TokenizerError(path, "", "");
}

TokenizerError refusal_of_text(const std::string& text) {
  TempDir dir("tokbad");
  return refusal(write_text(dir.path() / "tokenizer.json", text));
}

TokenizerError refusal_of(const json& j) { return refusal_of_text(j.dump(1)); }

// The message names the file and the key, and says `words`.
#define EXPECT_REFUSED(error, expected_key, words)                         \
  do {                                                                     \
    const TokenizerError& e_ = (error);                                    \
    EXPECT_EQ(e_.key(), expected_key) << e_.what();                        \
    EXPECT_CONTAINS(e_.what(), e_.file().string());                        \
    if (!std::string(expected_key).empty()) EXPECT_CONTAINS(e_.what(), std::string(expected_key) + ": "); \
    EXPECT_CONTAINS(e_.what(), words);                                     \
  } while (0)

json with(std::function<void(json&)> change) {
  json j = tiny_tokenizer_json();
  change(j);
  return j;
}

}  // namespace

TEST(TokenizerLoad, FilesThatAreNotTokenizerFiles) {
  EXPECT_REFUSED(refusal("/no/such/tokenizer.json"), "", "no such file");
  TempDir empty("tokempty");
  EXPECT_REFUSED(refusal(empty.path()), "", "holds no tokenizer.json");
  EXPECT_REFUSED(refusal("/dev/null"), "", "not a regular file");
  TempDir fifo_dir("tokfifo");
  const fs::path fifo = fifo_dir.path() / "tokenizer.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_REFUSED(refusal(fifo), "", "not a regular file");  // and it did not wait for a writer
  EXPECT_REFUSED(refusal(fifo_dir.path()), "", "not a regular file");
}

TEST(TokenizerLoad, FilesAboveTheCapAreRefusedUnread) {
  TempDir dir("tokhuge");
  const fs::path file = dir.path() / "tokenizer.json";
  write_text(file, "{");
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(Tokenizer::kMaxFileBytes + 1)), 0);  // sparse: no disk used
  const auto start = std::chrono::steady_clock::now();
  EXPECT_REFUSED(refusal(file), "", "256 MiB are refused");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

TEST(TokenizerLoad, BrokenJson) {
  const std::string good = tiny_tokenizer_json().dump(1);
  EXPECT_REFUSED(refusal_of_text(""), "", "the file ends early");
  EXPECT_REFUSED(refusal_of_text(good.substr(0, good.size() / 2)), "", "the file ends early");
  EXPECT_REFUSED(refusal_of_text("{\"model\": }"), "", "invalid JSON at line 1, column 11");
  EXPECT_REFUSED(refusal_of_text("{\"model\":\n\n  {,}}"), "", "line 3");
  EXPECT_REFUSED(refusal_of_text(std::string("{\"a\": 1}\0garbage", 16)), "", "a NUL byte at line 1, column 9");
  EXPECT_REFUSED(refusal_of_text(std::string(200, '[') + std::string(200, ']')), "", "nested more than 64 levels");
  EXPECT_REFUSED(refusal_of_text("{\"model\": {\"vocab\": {\"a\": 1, \"a\": 2}}}"), "model.vocab.a", "the key \"a\" appears twice");
  // Columns count characters, not bytes, as the configuration files' do (one reader).
  EXPECT_REFUSED(refusal_of_text("{\"\xc3\xa9\": x}"), "", "invalid JSON at line 1, column 7");
  EXPECT_REFUSED(refusal_of_text("[1, 2]"), "", "must be an object, not an array");
  EXPECT_REFUSED(refusal_of_text("\"just a string\""), "", "must be an object, not a string");
}

TEST(TokenizerLoad, TheModel) {
  EXPECT_REFUSED(refusal_of(with([](json& j) { j.erase("model"); })), "model", "not a Hugging Face tokenizer.json");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"] = "BPE"; })), "model", "must be an object, not a string");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["type"] = "WordPiece"; })), "model.type",
                 "\"WordPiece\" (BERT-style) is not supported");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["type"] = "Unigram"; })), "model.type", "SentencePiece-style");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["type"] = "WordLevel"; })), "model.type", "not supported");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["type"] = 7; })), "model.type", "must be a string");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["byte_fallback"] = "yes"; })), "model.byte_fallback",
                 "must be true or false");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["fuse_unk"] = 1; })), "model.fuse_unk", "must be true or false");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["unk_token"] = "<unk>"; })), "model.unk_token",
                 "\"<unk>\" is not in model.vocab");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["unk_token"] = 0; })), "model.unk_token", "must be a string");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["dropout"] = 0.1; })), "model.dropout", "set it to null");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; })),
                 "model.continuing_subword_prefix", "not supported");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["ignore_merges"] = "yes"; })), "model.ignore_merges",
                 "must be true or false");
}

TEST(TokenizerLoad, TheVocabulary) {
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"].erase("vocab"); })), "model.vocab", "missing");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["vocab"] = json::array(); })), "model.vocab", "must be an object");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["vocab"] = json::object(); })), "model.vocab", "is empty");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["vocab"]["zz"] = -1; })), "model.vocab[\"zz\"]", "outside 0 ..");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["vocab"]["zz"] = 1.5; })), "model.vocab[\"zz\"]",
                 "a number with a fraction");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["vocab"]["zz"] = "7"; })), "model.vocab[\"zz\"]", "not a string");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["vocab"]["zz"] = 1ull << 40; })), "model.vocab[\"zz\"]",
                 "below 2^24");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["vocab"]["zz"] = 259; })), "model.vocab[\"zz\"]",
                 "is also the id of \"hello\"");
  // A vocabulary without the byte token of the space.
  EXPECT_REFUSED(refusal_of(with([](json& j) {
                   j["model"]["vocab"].erase("Ġ");
                   j["model"]["merges"] = json::array({"h e"});
                 })),
                 "model.vocab", "lacks 1 of the 256 byte tokens of a byte-level BPE: \"Ġ\" (byte 0x20)");
}

TEST(TokenizerLoad, TheMerges) {
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"].erase("merges"); })), "model.merges", "missing");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["merges"] = "h e"; })), "model.merges", "must be an array");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["merges"].push_back("h ☃"); })), "model.merges[11]",
                 "names the right token \"☃\", which is not in the vocabulary");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["model"]["merges"].push_back("x y"); })), "model.merges[11]",
                 "names the merged token \"xy\"");
  for (const char* bad : {"he", "h  e", "h e l", " h", "h "})
    EXPECT_REFUSED(refusal_of(with([&](json& j) { j["model"]["merges"][3] = bad; })), "model.merges[3]",
                   "two tokens separated by one space");
  for (const json& bad : {json(5), json::array({"h"}), json::array({"h", 1}), json::object()})
    EXPECT_REFUSED(refusal_of(with([&](json& j) { j["model"]["merges"][3] = bad; })), "model.merges[3]",
                   "must be \"left right\" or [\"left\", \"right\"]");
}

TEST(TokenizerLoad, TheAddedTokens) {
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["added_tokens"] = json::object(); })), "added_tokens", "must be an array");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["added_tokens"][0] = 5; })), "added_tokens[0]", "must be an object");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["added_tokens"][1].erase("id"); })), "added_tokens[1].id", "missing");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["added_tokens"][1]["content"] = ""; })), "added_tokens[1].content",
                 "is empty");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["added_tokens"][1]["special"] = "yes"; })), "added_tokens[1].special",
                 "must be true or false");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["added_tokens"][1]["id"] = 300; })), "added_tokens[1].id",
                 "300 is also the id of the added token \"<|s|>\"");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["added_tokens"][1]["content"] = "<|s|>"; })), "added_tokens[1].content",
                 "is also added with id 300");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["added_tokens"][1]["content"] = "hello"; })), "added_tokens[1].id",
                 "differs from the id 259 that model.vocab gives \"hello\"");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["added_tokens"][1]["id"] = 32; })), "added_tokens[1].id",
                 "32 is the id of the vocabulary's token \"Ġ\"");
}

TEST(TokenizerLoad, NormalizersAndPreTokenizers) {
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; })), "normalizer.type",
                 "the normalizer \"Lowercase\" is not supported");
  EXPECT_REFUSED(refusal_of(with([](json& j) {
                   j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}};
                 })),
                 "normalizer.normalizers[1].type", "\"Strip\" is not supported");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["normalizer"] = "NFC"; })), "normalizer", "must be an object");
  EXPECT_REFUSED(refusal_of(with([](json& j) {
                   j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", ""}}}, {"content", "x"}};
                 })),
                 "normalizer.pattern.String", "is empty");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}}; })),
                 "normalizer.content", "missing");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["normalizer"] = {{"type", "Prepend"}, {"prepend", 1}}; })),
                 "normalizer.prepend", "must be a string");
  const json metaspace = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}};
  const auto with_metaspace = [&](const char* field, const json& value) {
    return with([&](json& j) {
      j["pre_tokenizer"] = metaspace;
      j["pre_tokenizer"][field] = value;
    });
  };
  EXPECT_REFUSED(refusal_of(with_metaspace("replacement", "__")), "pre_tokenizer.replacement", "must be one character");
  EXPECT_REFUSED(refusal_of(with_metaspace("replacement", "")), "pre_tokenizer.replacement", "must be one character");
  EXPECT_REFUSED(refusal_of(with_metaspace("prepend_scheme", "sometimes")), "pre_tokenizer.prepend_scheme",
                 "is not a prepend scheme (always, first or never)");
  EXPECT_REFUSED(refusal_of(with_metaspace("split", "no")), "pre_tokenizer.split", "must be true or false");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; })), "pre_tokenizer.type",
                 "the pre-tokenizer \"Whitespace\" is not supported");
  const json split = {{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_REFUSED(refusal_of(with([&](json& j) {
                   j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {j["pre_tokenizer"], split}}};
                 })),
                 "pre_tokenizer.pretokenizers[1].type", "ByteLevel must be the last pre-tokenizer");
  const auto with_split = [&](const json& s) {
    return with([&](json& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {s, j["pre_tokenizer"]}}}; });
  };
  json bad = split;
  bad["pattern"]["Regex"] = "(unclosed";
  EXPECT_REFUSED(refusal_of(with_split(bad)), "pre_tokenizer.pretokenizers[0].pattern.Regex",
                 "ICU cannot compile the regular expression (U_REGEX_MISMATCHED_PAREN");
  bad = split;
  bad["behavior"] = "Sideways";
  EXPECT_REFUSED(refusal_of(with_split(bad)), "pre_tokenizer.pretokenizers[0].behavior", "is not a split behavior");
  bad = split;
  bad["pattern"]["String"] = " ";
  EXPECT_REFUSED(refusal_of(with_split(bad)), "pre_tokenizer.pretokenizers[0].pattern", "exactly one of");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["pre_tokenizer"].erase("add_prefix_space"); })),
                 "pre_tokenizer.add_prefix_space", "missing");
}

TEST(TokenizerLoad, PostProcessorsAndDecoders) {
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["post_processor"] = {{"type", "Fancy"}}; })), "post_processor.type",
                 "the post-processor \"Fancy\" is not supported");
  const auto templ = [](json single, json specials) {
    return with([&](json& j) {
      j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
    });
  };
  const json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const json s = {{"SpecialToken", {{"id", "<|s|>"}, {"type_id", 0}}}};
  const json specials = {{"<|s|>", {{"id", "<|s|>"}, {"ids", {300}}, {"tokens", {"<|s|>"}}}}};
  EXPECT_REFUSED(refusal_of(templ({s, a}, json::object())), "post_processor.special_tokens",
                 "has no entry \"<|s|>\", which the template uses");
  EXPECT_REFUSED(refusal_of(templ({s, a}, {{"<|s|>", {{"id", "<|s|>"}, {"ids", {9999}}}}})),
                 "post_processor.special_tokens.<|s|>.ids[0]", "9999 is not a token of this tokenizer");
  EXPECT_REFUSED(refusal_of(templ({s}, specials)), "post_processor.single", "does not place the text");
  EXPECT_REFUSED(refusal_of(templ({s, {{"Sequence", {{"id", "B"}}}}}, specials)), "post_processor.single[1].Sequence.id",
                 "must be \"A\"");
  EXPECT_REFUSED(refusal_of(templ({5}, specials)), "post_processor.single[0]", "must be an object");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["decoder"] = nullptr; })), "decoder",
                 "the decoder turns tokens back into text");
  EXPECT_REFUSED(refusal_of(with([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; })), "decoder.type",
                 "the decoder \"WordPiece\" is not supported");
  EXPECT_REFUSED(refusal_of(with([](json& j) {
                   j["decoder"] = {{"type", "Sequence"}, {"decoders", {j["decoder"], {{"type", "CTC"}}}}};
                 })),
                 "decoder.decoders[1].type", "\"CTC\"");
  EXPECT_REFUSED(refusal_of(with([](json& j) {
                   j["decoder"] = {{"type", "Strip"}, {"content", "  "}, {"start", 1}, {"stop", 0}};
                 })),
                 "decoder.content", "must be one character");
  EXPECT_REFUSED(refusal_of(with([](json& j) {
                   j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}};
                 })),
                 "decoder.start", "must be a count");
  EXPECT_REFUSED(refusal_of(with([](json& j) {
                   j["decoder"] = {{"type", "Replace"}, {"pattern", {{"Regex", "("}}}, {"content", " "}};
                 })),
                 "decoder.pattern.Regex", "ICU cannot compile");
}

TEST(TokenizerLoad, Gpt2FilesAndTheByteFormat) {
  const json j = tiny_tokenizer_json();
  TempDir dir("tokgpt2bad");
  write_text(dir.path() / "encoder.json", j["model"]["vocab"].dump());
  write_text(dir.path() / "vocab.bpe", "#version: 0.2\nh e\nl l l\n");
  const TokenizerError e = refusal(dir.path());
  EXPECT_EQ(e.file(), dir.path() / "vocab.bpe");
  EXPECT_REFUSED(e, "line 3", "two tokens separated by one space");
  write_text(dir.path() / "vocab.bpe", "#version: 0.2\nh e\n\nl l\n");
  EXPECT_REFUSED(refusal(dir.path()), "line 3", "is empty");
  write_text(dir.path() / "encoder.json", "{\"a\": ");
  EXPECT_REFUSED(refusal(dir.path()), "", "ends early");

  EXPECT_REFUSED(refusal_of({{"type", "bytes"}, {"vocab_size", 260}, {"bos_token_id", 10}}), "bos_token_id",
                 "ids below 256 are bytes");
  EXPECT_REFUSED(refusal_of({{"type", "bytes"}, {"vocab_size", 100}}), "vocab_size", "below 256");
  EXPECT_REFUSED(refusal_of({{"type", "bytes"}}), "vocab_size", "missing");
  EXPECT_REFUSED(refusal_of({{"type", "bytes"}, {"vocab_size", 260}, {"bos_token_id", 256}, {"eos_token_id", 256}}),
                 "eos_token_id", "256 is also <bos>'s id");
}

// A seeded stream of damaged tokenizer.json files: bytes flipped, cut,
// repeated; values swapped for values of other types; keys deleted. Each
// either loads (and then encodes and decodes) or gives a TokenizerError.
TEST(TokenizerFuzz, MutatedFilesGiveTokenizerErrorsOrWork) {
  std::mt19937_64 rng(15);
  // Every other mutation starts from the SentencePiece-style file (byte fallback, unk, Prepend, Strip).
  const json bases[] = {tiny_tokenizer_json(), dflash::test::tiny_sentencepiece_json(true)};
  const std::string texts[] = {bases[0].dump(), bases[1].dump()};
  const json odd_values[] = {nullptr, true, 0, -1, 1e300, 1ll << 40, "x", "", "\xE2\x96\x81", json::array(),
                             json::object(), json::array({"h", "e"}), "h e", {{"type", "Sequence"}},
                             {{"type", "ByteLevel"}}, {{"type", "Metaspace"}}, {{"type", "ByteFallback"}},
                             {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 9}}};
  const auto pick = [&](std::size_t n) { return n == 0 ? std::size_t{0} : static_cast<std::size_t>(rng() % n); };
  // A random node of the tree (objects and arrays may be picked themselves).
  const std::function<json*(json&, int)> random_node = [&](json& j, int depth) -> json* {
    if (!j.is_structured() || j.empty() || depth > 6 || pick(4) == 0) return &j;
    auto it = j.begin();
    std::advance(it, static_cast<long>(pick(j.size())));
    return random_node(*it, depth + 1);
  };
  TempDir dir("tokfuzz");
  const fs::path file = dir.path() / "tokenizer.json";
  int loaded = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  int i = 0;
  for (; i < 4000 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 4.0; ++i) {
    std::string mutated;
    const json& base = bases[i % 2];
    const int kind = static_cast<int>(pick(3));
    if (kind == 0) {  // bytes
      mutated = texts[i % 2];
      for (int k = 0, n = 1 + static_cast<int>(pick(4)); k < n && !mutated.empty(); ++k) {
        const std::size_t at = pick(mutated.size());
        switch (pick(4)) {
          case 0: mutated[at] = static_cast<char>(rng()); break;
          case 1: mutated.erase(at, pick(64)); break;
          case 2: mutated.insert(at, mutated.substr(pick(mutated.size()), pick(32))); break;
          default: mutated.resize(at); break;
        }
      }
    } else {  // structure
      json j = base;
      for (int k = 0, n = 1 + static_cast<int>(pick(3)); k < n; ++k) {
        json* node = random_node(j, 0);
        if (kind == 1 || !node->is_object() || node->empty()) {
          *node = odd_values[pick(std::size(odd_values))];
        } else {
          auto it = node->begin();
          std::advance(it, static_cast<long>(pick(node->size())));
          node->erase(it.key());
        }
      }
      mutated = j.dump();
    }
    write_text(file, mutated);
    try {
      const Tokenizer t = Tokenizer::load(file);
      ++loaded;
      const Ids ids = t.encode("hello world <|s|> aaa \xF0\x9F\x98\x80 \xFF hi  there \xE4\xB8\xAD\xC3\xA9 <s>", true);
      (void)t.decode(ids, i % 2 == 0);
    } catch (const TokenizerError& e) {
      ++refused;
      EXPECT_CONTAINS(e.what(), file.string());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << i << " threw a " << typeid(e).name() << ", not a TokenizerError: " << e.what()
                    << "\nfile: " << mutated.substr(0, 2000);
    }
  }
  std::printf("[ fuzz     ] %d mutated files: %d loaded, %d refused\n", i, loaded, refused);
  EXPECT_GT(i, 200);
  EXPECT_GT(refused, i / 4);  // most damage is found...
  EXPECT_GT(loaded, 10);      // ...and harmless changes (a flag, an unused key) still load
}

// Random bytes, valid UTF-8 or not: encode never throws, and decoding gives
// the text back with each ill-formed sequence as U+FFFD (NFC for Qwen).
TEST(TokenizerFuzz, RandomBytesEncodeAndDecodeBackRepaired) {
  std::vector<std::pair<std::string, Tokenizer>> tokenizers;
  {
    json j = tiny_tokenizer_json();
    j["normalizer"] = nullptr;
    j["added_tokens"][2]["lstrip"] = false;  // stripping drops whitespace: no round trip
    j["added_tokens"][3]["rstrip"] = false;
    TempDir dir("tokrand");
    tokenizers.emplace_back("tiny", Tokenizer::load(write_json(dir, j)));
  }
  if (dflash::test::real_files_present()) {
    tokenizers.emplace_back("qwen3", Tokenizer::load(dflash::test::qwen3_file()));
    tokenizers.emplace_back("gpt2", Tokenizer::load(dflash::test::gpt2_dir()));
  }
  const dflash::text::unicode::Normalization nfc({dflash::text::unicode::Form::kNFC});
  const std::string pieces[] = {" ", "  ", "\n", "\t", "a", "Hello", "'s", "'LL", "123", "\xC3\xA9", "e\xCC\x81", "\xE4\xB8\xAD",
                                "\xF0\x9F\x98\x80", "\xE2\x80\x8D", "<|endoftext|>", "<|im_start|>", "<|s|>", "[L]", "word",
                                "\xFF", "\xC3", "\xE2\x82", "\xED\xA0\x80", "\xF4\x90\x80\x80", std::string(1, '\0')};
  std::mt19937_64 rng(15);
  for (int i = 0; i < 600; ++i) {
    std::string text;
    const std::size_t length = rng() % 200;
    while (text.size() < length) {
      if (rng() % 3 == 0)
        text.push_back(static_cast<char>(rng()));
      else
        text += pieces[rng() % std::size(pieces)];
    }
    const std::string repaired = dflash::text::utf8::make_valid(text);
    for (const auto& [name, t] : tokenizers) {
      Ids ids;
      ASSERT_NO_THROW(ids = t.encode(text)) << name << ": " << json(repaired).dump();
      EXPECT_EQ(ids, t.encode(repaired)) << name << ": invalid bytes encode as U+FFFD";
      const std::string expected = name == "qwen3" ? nfc.apply(repaired) : repaired;
      EXPECT_EQ(t.decode(ids), expected) << name << ": " << json(repaired).dump();
    }
  }
}

// A megabyte of one character class is one pre-token: merged in n log n, and
// ICU's regex may use the heap for its backtracking (its 8 MB stack overflows).
TEST(TokenizerFuzz, LongRunsOfOneKindEncode) {
  std::vector<Tokenizer> tokenizers{Tokenizer::load(write_json(TempDir("toklong"), tiny_tokenizer_json()))};
  if (dflash::test::real_files_present()) tokenizers.push_back(Tokenizer::load(dflash::test::qwen3_file()));
  for (const std::string& unit : {std::string(" "), std::string("\n"), std::string(" \n"), std::string("a"),
                                  std::string("\xE6\xB1\x89"), std::string("7"), std::string(".,")}) {
    // Whitespace overflowed ICU's default stack at 1 MB; the others check that
    // a long piece merges in n log n.
    const std::size_t size = unit.find_first_not_of(" \n") == std::string::npos ? (1u << 20) : (1u << 18);
    std::string text;
    while (text.size() < size) text += unit;
    for (const Tokenizer& t : tokenizers) {
      const Ids ids = t.encode(text);
      EXPECT_EQ(t.decode(ids), text) << "a run of " << json(unit).dump();
    }
  }
}
