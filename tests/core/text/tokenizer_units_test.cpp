// The tokenizer's stages one at a time, on a small hand-made tokenizer.json
// whose right answers can be worked out by hand (tiny_tokenizer.h), on the
// quickstart target's byte tokenizer, and on a few ids of the real files
// everyone knows ("Hello world").
#include "text/byte_level.h"
#include "text/pre_tokenizer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "core/text/tiny_tokenizer.h"

#include "support/expect.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

using dflash::test::TempDir;
using dflash::test::tiny_tokenizer_json;
using dflash::test::write_json;
using dflash::text::Tokenizer;
using Ids = std::vector<int64_t>;
using nlohmann::json;

namespace {

Tokenizer tiny(const json& j = tiny_tokenizer_json()) { return dflash::test::load_json(j); }

const std::string kFFFD = "\xEF\xBF\xBD";

}  // namespace

// An excerpt for a message starts and ends on character boundaries.
TEST(Utf8, AWindowNeverCutsACharacter) {
  using dflash::text::utf8::window;
  const std::string text = "ab\xE4\xB8\xAD\xF0\x9F\x98\x80z";  // a b 中 😀 z: 2 + 3 + 4 + 1 bytes
  EXPECT_EQ(window(text, 0, 4), "ab");                             // 中 would be cut: left out
  EXPECT_EQ(window(text, 3, 5), "\xE4\xB8\xAD");                    // starts back at 中's first byte
  EXPECT_EQ(window(text, 4, 100), "\xE4\xB8\xAD\xF0\x9F\x98\x80z");  // back to 中, to the end
  EXPECT_EQ(window(text, 100, 5), "");
  EXPECT_TRUE(dflash::text::utf8::is_valid(window(text, 6, 3)));
}

TEST(Utf8, ReplacesEachMaximalSubpartByOneReplacementCharacter) {
  using dflash::text::utf8::make_valid;
  EXPECT_EQ(make_valid("plain ascii"), "plain ascii");
  EXPECT_EQ(make_valid("\xE4\xB8\xAD\xF0\x9F\x98\x80"), "\xE4\xB8\xAD\xF0\x9F\x98\x80");  // 中😀 untouched
  EXPECT_EQ(make_valid("a\xFF" "b"), "a" + kFFFD + "b");                 // never a lead byte
  EXPECT_EQ(make_valid("\xE2\x82"), kFFFD);                              // a truncated 3-byte sequence: one
  EXPECT_EQ(make_valid("\xE2\x82z"), kFFFD + "z");                        // ... and the next byte is kept
  EXPECT_EQ(make_valid("\xF0\x80\x80"), kFFFD + kFFFD + kFFFD);          // F0 needs 90..BF next: overlong
  EXPECT_EQ(make_valid("\xC0\xAF"), kFFFD + kFFFD);                       // C0 is never valid
  EXPECT_EQ(make_valid("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);          // a UTF-16 surrogate
  EXPECT_EQ(make_valid("\xF4\x90\x80\x80"), kFFFD + kFFFD + kFFFD + kFFFD);  // above U+10FFFF
  EXPECT_EQ(make_valid("\xF0\x9F\x98"), kFFFD);                           // a cut emoji
  EXPECT_TRUE(dflash::text::utf8::is_valid(""));
  EXPECT_FALSE(dflash::text::utf8::is_valid("\x80"));
}

TEST(ByteLevel, MapsBytesToCharactersAsGpt2Does) {
  using namespace dflash::text::byte_level;
  EXPECT_EQ(char_of(' '), "Ġ");
  EXPECT_EQ(char_of('\n'), "Ċ");
  EXPECT_EQ(char_of('\t'), "ĉ");
  EXPECT_EQ(char_of(0), "Ā");
  EXPECT_EQ(char_of('!'), "!");
  EXPECT_EQ(char_of(0xAD), "Ń");  // the soft hyphen is not printable: mapped above U+0100
  EXPECT_EQ(char_of(0xFF), "ÿ");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(to_bytes(from_bytes(all)), all);
  EXPECT_EQ(to_bytes("Ġthe"), " the");
  EXPECT_EQ(to_bytes("<|im_start|>"), "<|im_start|>");  // ASCII stands for itself
  EXPECT_EQ(to_bytes("中"), std::nullopt);               // not one of the 256
}

// The example of Hugging Face's Split documentation: "the-final--countdown" cut at "-".
TEST(PreTokenizer, SplitBehavesAsHuggingFaceDocuments) {
  using dflash::text::SplitBehavior;
  const auto pieces = [](SplitBehavior behavior, bool invert) {
    dflash::text::PreTokenizer p;
    p.add(dflash::text::SplitStep{std::make_shared<const dflash::text::unicode::Regex>("-", true), behavior, invert});
    std::vector<std::string> out;
    p.run("the-final--countdown", out);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(SplitBehavior::kRemoved, false), (V{"the", "final", "countdown"}));
  EXPECT_EQ(pieces(SplitBehavior::kIsolated, false), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces(SplitBehavior::kMergedWithPrevious, false), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces(SplitBehavior::kMergedWithNext, false), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces(SplitBehavior::kContiguous, false), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(pieces(SplitBehavior::kRemoved, true), (V{"-", "-", "-"}));  // invert: the matches are kept
}

// A tokenizer.json pattern that backtracks exponentially ((a|aa)+$ on 40
// a's took 32.5 s; longer runs, hours) is stopped by ICU's time limit, and
// the error names the file, the key and the pattern.
TEST(PreTokenizer, AnExponentialPatternIsStoppedNamingTheFileAndPattern) {
  json j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+$"}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  TempDir dir("tok_evil");
  const auto file = write_json(dir, j);
  const Tokenizer t = Tokenizer::load(file);
  EXPECT_EQ(t.decode(t.encode("aaa", false)), "aaa") << "a benign text still encodes";
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)t.encode(std::string(64, 'a') + "b", false);
    FAIL() << "the search ran to its end";
  } catch (const std::runtime_error& e) {
    EXPECT_CONTAINS(e.what(), file.string() + " (pre_tokenizer.pretokenizers[0].pattern.Regex): the pattern \"(a|aa)+$\" took more "
                              "than ICU's time limit");
    EXPECT_CONTAINS(e.what(), "on a text of 65 bytes");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30.0) << "the limit stopped it (64 a's alone would take days)";
  std::printf("[ limit    ] stopped after %.2f s\n", seconds);
}

TEST(PreTokenizer, Gpt2PatternCutsWordsSpacesAndContractions) {
  dflash::text::PreTokenizer p;
  p.add(dflash::text::ByteLevelStep{false, true});
  std::vector<std::string> out;
  p.run("Hello world's  code\n x  ", out);
  // "  code": the first space stays alone (\s+(?!\S)) so the second can lead the word.
  EXPECT_EQ(out, (std::vector<std::string>{"Hello", " world", "'s", " ", " code", "\n", " x", "  "}));
  out.clear();
  p.run("", out);
  EXPECT_TRUE(out.empty());
}

TEST(PreTokenizer, PatternsOfQwenAndLlama3CutDigitsDifferently) {
  const auto split = [](const char* pattern) {
    dflash::text::PreTokenizer p;
    p.add(dflash::text::SplitStep{std::make_shared<const dflash::text::unicode::Regex>(pattern, false),
                                  dflash::text::SplitBehavior::kIsolated, false});
    std::vector<std::string> out;
    p.run("x 1234567 I'M", out);
    return out;
  };
  using V = std::vector<std::string>;
  // Qwen2/Qwen3: one digit per piece; Llama-3: up to three; both take 'M case-insensitively.
  EXPECT_EQ(split(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
            (V{"x", " ", "1", "2", "3", "4", "5", "6", "7", " I", "'M"}));
  EXPECT_EQ(split(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
            (V{"x", " ", "123", "456", "7", " I", "'M"}));
}

TEST(Bpe, MergesTheLowestRankFirstAndTheLeftmostOfEqualRanks) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.encode("hello world"), (Ids{259, 264}));
  EXPECT_EQ(t.encode("hello"), (Ids{259}));  // he, ll, hell, hello: four merges in rank order
  EXPECT_EQ(t.encode("aaa"), (Ids{265, 'a'}));  // the leftmost pair merges first
  EXPECT_EQ(t.encode("aaaa"), (Ids{265, 265}));
  EXPECT_EQ(t.encode("aaaaa"), (Ids{265, 265, 'a'}));
  EXPECT_EQ(t.encode("heLLo"), (Ids{256, 'L', 'L', 'o'}));
  EXPECT_EQ(t.encode("a   b"), (Ids{'a', 266, ' ', 'b'}));  // "a", "  " (ĠĠ), " b"
  EXPECT_EQ(t.encode(""), Ids{});
  // The cache gives the same answer the second time.
  EXPECT_EQ(t.encode("hello hello hello"), (Ids{259, ' ', 259, ' ', 259}));
}

TEST(Bpe, MergesReadAsPairsGiveTheSameIds) {
  json j = tiny_tokenizer_json();
  for (json& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  const Tokenizer t = tiny(j);
  EXPECT_EQ(t.encode("hello world aaa"), (Ids{259, 264, ' ', 265, 'a'}));
}

TEST(Bpe, IgnoreMergesTakesAWholeVocabularyWord) {
  json j = tiny_tokenizer_json();
  j["model"]["vocab"]["abc"] = 270;  // no merge makes it
  EXPECT_EQ(tiny(j).encode("abc"), (Ids{'a', 'b', 'c'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(tiny(j).encode("abc"), (Ids{270}));
  EXPECT_EQ(tiny(j).encode("hello"), (Ids{259}));
}

TEST(ByteLevel, AddPrefixSpaceGoesBeforeEverySection) {
  json j = tiny_tokenizer_json();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  const Tokenizer t = tiny(j);
  EXPECT_EQ(t.encode("hello"), (Ids{' ', 259}));
  EXPECT_EQ(t.encode(" hello"), (Ids{' ', 259}));  // already there: not doubled
  EXPECT_EQ(t.encode("hello<|s|>hello"), (Ids{' ', 259, 300, ' ', 259}));
}

TEST(AddedTokens, AreFoundInsideTextLeftmostLongest) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.encode("a<|s|>b"), (Ids{'a', 300, 'b'}));
  EXPECT_EQ(t.encode("<|s|>x"), (Ids{305}));  // "<|s|>x" is longer than "<|s|>"
  EXPECT_EQ(t.encode("<|s|>y"), (Ids{300, 'y'}));
  EXPECT_EQ(t.encode("<|s|<|s|>"), (Ids{'<', '|', 's', '|', 300}));
  EXPECT_EQ(t.encode("a<x>"), (Ids{'a', 301}));
}

TEST(AddedTokens, StripAndSingleWordRules) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.encode("a  [L]b"), (Ids{'a', 302, 'b'}));   // lstrip takes the spaces before it
  EXPECT_EQ(t.encode("a[R] \n b"), (Ids{'a', 303, 'b'}));  // rstrip the whitespace after it
  EXPECT_EQ(t.encode("a [R]b"), (Ids{'a', ' ', 303, 'b'}));
  EXPECT_EQ(t.encode("a word b"), (Ids{'a', ' ', 304, ' ', 'b'}));
  EXPECT_EQ(t.encode("word."), (Ids{304, '.'}));
  // Inside a word it is not the added token: "swordfish" is merged normally (only "or" applies).
  EXPECT_EQ(t.encode("swordfish"), (Ids{'s', 'w', 261, 'd', 'f', 'i', 's', 'h'}));
  EXPECT_EQ(t.encode("_word"), (Ids{'_', 'w', 261, 'd'}));  // "_" is a word character (\w)
}

TEST(Normalizer, NfcMakesDecomposedTextEncodeAsComposed) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.encode("e\xCC\x81"), (Ids{0xC3, 0xA9}));  // e + U+0301 -> é
  EXPECT_EQ(t.decode(t.encode("cafe\xCC\x81")), "caf\xC3\xA9");
  json j = tiny_tokenizer_json();
  j["normalizer"] = nullptr;
  EXPECT_EQ(tiny(j).encode("e\xCC\x81"), (Ids{'e', 0xCC, 0x81}));
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFD"}}})}};
  EXPECT_EQ(tiny(j).encode("\xC3\xA9"), (Ids{'e', 0xCC, 0x81}));
}

TEST(AddedTokens, NormalizedOnesMatchTheNormalizedText) {
  json j = tiny_tokenizer_json();
  const std::string nfd = "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB";  // 한 as three jamo (NFD)
  const std::string nfc = "\xED\x95\x9C";                             // 한 (NFC)
  j["added_tokens"].push_back({{"id", 310}, {"content", nfd}, {"special", false}, {"lstrip", false},
                               {"rstrip", false}, {"single_word", false}, {"normalized", true}});
  const Tokenizer t = tiny(j);
  EXPECT_EQ(t.encode("a" + nfc), (Ids{'a', 310}));  // NFC text, NFD token: matched after NFC
  EXPECT_EQ(t.encode("a" + nfd), (Ids{'a', 310}));  // NFD text too
  EXPECT_EQ(t.decode({310}), nfc);  // decoded in the form it is matched in, as HF does
  EXPECT_EQ(t.id_to_token(310), nfd);
}

// HF's ByteLevel decoder maps every token whose characters are all byte
// characters back to bytes, added tokens included: "éé" is the bytes E9 E9,
// not UTF-8, so HF decodes this added token as two U+FFFD. We do the same.
TEST(AddedTokens, DecodeThroughTheByteLevelDecoderAsHuggingFace) {
  json j = tiny_tokenizer_json();
  j["added_tokens"].push_back({{"id", 311}, {"content", "\xC3\xA9\xC3\xA9"}, {"special", false}, {"normalized", false}});
  const Tokenizer t = tiny(j);
  EXPECT_EQ(t.encode("\xC3\xA9\xC3\xA9"), (Ids{311}));
  EXPECT_EQ(t.decode({311}), kFFFD + kFFFD);
}

TEST(PostProcessor, TemplateAddsItsTokensOnlyWhenAsked) {
  json j = tiny_tokenizer_json();
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|s|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
           {{"SpecialToken", {{"id", "[R]"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens",
          {{"<|s|>", {{"id", "<|s|>"}, {"ids", {300}}, {"tokens", {"<|s|>"}}}},
           {"[R]", {{"id", "[R]"}, {"ids", {303}}, {"tokens", {"[R]"}}}}}}}}}};
  const Tokenizer t = tiny(j);
  EXPECT_EQ(t.encode("hi", true), (Ids{300, 'h', 'i', 303}));
  EXPECT_EQ(t.encode("hi", false), (Ids{'h', 'i'}));
  EXPECT_EQ(tiny().encode("hi", true), (Ids{'h', 'i'}));  // ByteLevel alone adds nothing
}

TEST(PostProcessor, RobertaProcessingPutsClsAndSepAround) {
  json j = tiny_tokenizer_json();
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"[R]", 303}}, {"cls", {"<|s|>", 300}},
                         {"trim_offsets", true}, {"add_prefix_space", false}};
  EXPECT_EQ(tiny(j).encode("hi", true), (Ids{300, 'h', 'i', 303}));
  EXPECT_EQ(tiny(j).encode("hi"), (Ids{'h', 'i'}));
}

TEST(Decode, SkipsSpecialTokensUnknownIdsAndRepairsCutCharacters) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.decode({259, 264}), "hello world");
  EXPECT_EQ(t.decode({300, 259, 301}), "<|s|>hello<x>");
  EXPECT_EQ(t.decode({300, 259, 301}, true), "hello<x>");  // <x> is not special
  EXPECT_EQ(t.decode({-1, 99999, 299, 259}), "hello");     // no token: skipped, as HF does
  EXPECT_EQ(t.decode({0xE4, 0xB8, 0xAD}), "中");
  EXPECT_EQ(t.decode({0xE4, 0xB8}), kFFFD);  // a character cut in two
  EXPECT_EQ(t.decode({}), "");
}

TEST(Vocabulary, LooksTokensUpBothWays) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.vocab_size(), 306);
  EXPECT_EQ(t.id_to_token(' '), "Ġ");
  EXPECT_EQ(t.id_to_token(264), "Ġworld");
  EXPECT_EQ(t.id_to_token(300), "<|s|>");
  EXPECT_EQ(t.id_to_token(299), std::nullopt);  // a gap
  EXPECT_EQ(t.id_to_token(306), std::nullopt);
  EXPECT_EQ(t.id_to_token(-5), std::nullopt);
  EXPECT_EQ(t.token_to_id("Ġw"), 260);
  EXPECT_EQ(t.token_to_id("<|s|>"), 300);
  EXPECT_EQ(t.token_to_id("nope"), std::nullopt);
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special(301));
  EXPECT_FALSE(t.is_special(259));
}

TEST(Loading, ADirectoryMeansItsTokenizerJson) {
  TempDir dir("tokdir");
  const auto file = write_json(dir, tiny_tokenizer_json());
  const Tokenizer t = Tokenizer::load(dir.path());
  EXPECT_EQ(t.source(), file);
  EXPECT_EQ(t.encode("hello"), (Ids{259}));
}

TEST(Loading, Gpt2EncoderJsonAndVocabBpe) {
  const json j = tiny_tokenizer_json();
  json vocab = j["model"]["vocab"];
  vocab["<|endoftext|>"] = 300;
  std::string merges = "#version: 0.2\n";
  for (const json& m : j["model"]["merges"]) merges += m.get<std::string>() + "\n";
  for (const auto& [encoder, bpe] : {std::pair{"encoder.json", "vocab.bpe"}, std::pair{"vocab.json", "merges.txt"}}) {
    TempDir dir("gpt2");
    dflash::test::write_text(dir.path() / encoder, vocab.dump());
    dflash::test::write_text(dir.path() / bpe, merges);
    const Tokenizer t = Tokenizer::load(dir.path());
    EXPECT_EQ(t.encode("hello world<|endoftext|>a"), (Ids{259, 264, 300, 'a'})) << encoder;
    EXPECT_TRUE(t.is_special(300));
    EXPECT_EQ(t.decode({259, 300}, true), "hello");
  }
}

// The quickstart target's own format: ids 0-255 are bytes, BOS first on request.
TEST(Loading, TheQuickstartByteTokenizer) {
  const Tokenizer t = Tokenizer::load(std::filesystem::path(DFLASH_CONFIGS_DIR) / "quickstart/target");
  EXPECT_EQ(t.vocab_size(), 260);
  EXPECT_EQ(t.encode("h\xC3\xA9", true), (Ids{256, 'h', 0xC3, 0xA9}));
  EXPECT_EQ(t.encode("h\xC3\xA9"), (Ids{'h', 0xC3, 0xA9}));
  EXPECT_EQ(t.encode("  \n\n  x"), (Ids{' ', ' ', '\n', '\n', ' ', ' ', 'x'}));
  EXPECT_EQ(t.encode("a<eos>"), (Ids{'a', 257}));
  EXPECT_EQ(t.decode({256, 'h', 0xC3, 0xA9, 257}), "<bos>h\xC3\xA9<eos>");
  EXPECT_EQ(t.decode({256, 'h', 257}, true), "h");
  EXPECT_EQ(t.id_to_token(259), "<mask>");
  EXPECT_EQ(t.id_to_token(' '), "Ġ");
}

// Ids published with the models (e.g. the Qwen2 and Llama-3 model cards' examples).
TEST(RealTokenizers, EncodeHelloWorldAsTheModelsDo) {
  SKIP_WITHOUT_REAL_FILES();
  const Tokenizer qwen = Tokenizer::load(dflash::test::qwen3_file());
  const Tokenizer llama = Tokenizer::load(dflash::test::llama3_file());
  const Tokenizer gpt2 = Tokenizer::load(dflash::test::gpt2_dir());
  EXPECT_EQ(qwen.encode("Hello world"), (Ids{9707, 1879}));
  EXPECT_EQ(llama.encode("Hello world"), (Ids{9906, 1917}));
  EXPECT_EQ(gpt2.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(qwen.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(qwen.encode("<|im_start|>user\n"), (Ids{151644, 872, 198}));
  EXPECT_EQ(llama.token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_EQ(qwen.vocab_size(), 151669);
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  EXPECT_EQ(gpt2.encode("<|endoftext|>"), (Ids{50256}));
  EXPECT_TRUE(qwen.is_special(151643));
  EXPECT_FALSE(qwen.is_special(151667));  // <think> is added but not special
}

// (?i:'s|...) folds case as Unicode does, so "'ſ" (long s) is the contraction
// "'s", as in Hugging Face's tokenizers (Oniguruma); transformers.js spells the
// group out as [sS] and cuts "'ſpam" whole (docs/tokenizer.md).
TEST(RealTokenizers, CaseInsensitiveContractionsFoldLongS) {
  SKIP_WITHOUT_REAL_FILES();
  const Tokenizer qwen = Tokenizer::load(dflash::test::qwen3_file());
  Ids expected = qwen.encode("'\xC5\xBF");
  const Ids rest = qwen.encode("pam");
  expected.insert(expected.end(), rest.begin(), rest.end());
  EXPECT_EQ(qwen.encode("'\xC5\xBFpam"), expected);
}
