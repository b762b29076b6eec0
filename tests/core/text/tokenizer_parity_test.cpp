// Parity with the real tokenizers, live: the Node reference
// (tests/core/text/node/reference.js: Hugging Face's Rust `tokenizers` on the
// real tokenizer.json of each family, npm gpt-3-encoder for GPT-2) encodes the
// committed sample (tests/core/text/data/sample.jsonl, made by
// scripts/make_tokenizer_corpus.py --sample) and every document must give the
// same ids, the same decoded text, and decode back to itself. Skipped, with
// the command to run, when the Node project is not installed.
#include "core/text/parity.h"
#include "core/text/tiny_tokenizer.h"

#include "support/temp_dir.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

namespace {

using dflash::test::FamilyParity;
using dflash::text::Tokenizer;

struct Reference {
  std::unique_ptr<dflash::test::TempDir> dir;
  std::vector<nlohmann::json> rows;
  std::string failure;  // set when node ran and failed
};

std::string read_all(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::vector<std::string>& sample() {
  static const std::vector<std::string> docs = dflash::test::read_corpus(DFLASH_TOKENIZER_SAMPLE);
  return docs;
}

// The reference's output for one family (ctest runs each test in its own
// process, so each runs node for its family only).
Reference run_reference(const std::string& family) {
  Reference ref;
  ref.dir = std::make_unique<dflash::test::TempDir>("tokparity");
  const auto out = ref.dir->path() / "reference.jsonl";
  const auto log = ref.dir->path() / "reference.log";
  const std::string command = "node '" + (dflash::test::node_dir() / "reference.js").string() + "' --input '" +
                              DFLASH_TOKENIZER_SAMPLE + "' --output '" + out.string() + "' --variant-dir '" +
                              ref.dir->path().string() + "' --families " + family + " 2> '" + log.string() + "'";
  if (std::system(command.c_str()) != 0) {
    ref.failure = "the Node reference failed:\n" + command + "\n" + read_all(log);
    return ref;
  }
  ref.rows = dflash::test::read_reference(out);
  return ref;
}

#define NEED_REFERENCE(family, reference)                                                                         \
  SKIP_WITHOUT_REAL_FILES();                                                                                      \
  if (std::system("node --version > /dev/null 2>&1") != 0)                                                        \
    GTEST_SKIP() << "node is not on PATH (Debian: apt-get install nodejs npm; then npm ci in "                     \
                 << dflash::test::node_dir().string() << ")";                                                     \
  const Reference reference = run_reference(family);                                                              \
  ASSERT_EQ(reference.failure, "")

void expect_parity(const FamilyParity& r, std::size_t documents) {
  EXPECT_EQ(r.documents, static_cast<int64_t>(documents));
  EXPECT_EQ(r.id_mismatches, 0) << r.family << ": documents whose ids differ";
  EXPECT_EQ(r.decode_mismatches, 0) << r.family << ": documents whose decoded text differs";
  EXPECT_EQ(r.round_trip_failures, 0) << r.family << ": documents that do not decode back to themselves";
  for (const std::string& report : r.reports) ADD_FAILURE() << report;
  std::printf("[ parity   ] %s: %lld documents, %lld bytes, %lld tokens, %.2f MB/s\n", r.family.c_str(),
              static_cast<long long>(r.documents), static_cast<long long>(r.bytes), static_cast<long long>(r.tokens),
              double(r.bytes) / 1e6 / r.encode_seconds);
}

}  // namespace

// A mismatch inside non-ASCII text is reported, not thrown: the report's
// 60-byte window used to cut a character in two, and printing it as JSON
// aborted the whole parity run with a UTF-8 exception.
TEST(TokenizerParity, AMismatchInsideMultiByteTextIsReportedWhole) {
  const dflash::test::TempDir dir("tokparity_utf8");
  const Tokenizer t = Tokenizer::load(dflash::test::write_json(dir, dflash::test::tiny_tokenizer_json()));
  // Thirty 中 (three bytes each, one token a byte: the tiny tokenizer has no
  // merges for them), then two- and four-byte characters. A difference at
  // token i puts the window's start at byte i − 20: inside a character here.
  std::string document;
  for (int i = 0; i < 30; ++i) document += "\xE4\xB8\xAD";
  document += "\xC3\xA9t\xC3\xA9 \xF0\x9F\x8F\xBD";
  const std::vector<int64_t> ids = t.encode(document, false);
  for (std::size_t wrong : {std::size_t{31}, std::size_t{43}, std::size_t{61}}) {
    SCOPED_TRACE(wrong);
    std::vector<int64_t> reference_ids = ids;
    ASSERT_LT(wrong, reference_ids.size());
    reference_ids[wrong] = (reference_ids[wrong] + 1) % 256;
    const nlohmann::json row = {{"tiny", {{"ids", reference_ids}, {"text", t.decode(reference_ids)}}}};
    FamilyParity r;
    const dflash::test::ParityFamily tiny{"tiny", "", false, true, "", false};
    ASSERT_NO_THROW(r = dflash::test::compare_family(t, tiny, {document}, {row}));
    EXPECT_EQ(r.id_mismatches, 1);
    ASSERT_FALSE(r.reports.empty());
    EXPECT_NE(r.reports.front().find("first difference at token " + std::to_string(wrong)), std::string::npos)
        << r.reports.front();
  }
}

// What the sample must hold for the comparison to mean something.
TEST(TokenizerParity, TheSampleCoversTheHardCases) {
  const auto& docs = sample();
  std::string all;
  for (const auto& d : docs) all += d + "\n";
  EXPECT_GE(all.size(), 100000u);
  EXPECT_GE(docs.size(), 200u);
  for (const char* needle :
       {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",  // special tokens in text
        "\xE2\x80\x8D",                                                                   // a ZWJ sequence
        "\xF0\x9F\x8F\xBD",                                                               // a skin tone
        "\xF0\x9F\x87\xAF\xF0\x9F\x87\xB5",                                               // a flag (JP)
        "\xE4\xB8\xAD", "\xED\x95\x9C", "\xE3\x81\xB2",                                   // CJK: 中 한 ひ
        "\xD8\xA7\xD9\x84", "\xE0\xA4\xB9",                                               // Arabic, Devanagari
        "e\xCC\x81",                                                                      // NFD: e + U+0301
        "\t\t\t\t\t\t\t\t", "\r\n", "\n\n\n\n\n", "                    ",                 // whitespace runs
        "1234567890", "'ll", "'LL", "'Re", "def ", "#include", "    return"}) {
    EXPECT_NE(all.find(needle), std::string::npos) << "the sample lacks " << nlohmann::json(needle).dump();
  }
}

// Each family: our tokenizer on its file against the reference's ids and text.
static void check_family(const std::string& name) {
  const dflash::test::ParityFamily& family = dflash::test::parity_family(name);
  NEED_REFERENCE(name, ref);
  const Tokenizer t = Tokenizer::load(dflash::test::family_file(family, dflash::test::node_dir(), ref.dir->path()));
  expect_parity(dflash::test::compare_family(t, family, sample(), ref.rows), sample().size());
}

TEST(TokenizerParity, Qwen3MatchesHuggingFace) { check_family("qwen3"); }
TEST(TokenizerParity, Llama3MatchesHuggingFace) { check_family("llama3"); }
// The Llama-3 file as Meta ships it now, whose template puts <|begin_of_text|> first.
TEST(TokenizerParity, Llama3TemplateAddsBeginOfTextAsHuggingFace) { check_family("llama3_bos"); }
// SentencePiece-style BPE: "▁" for spaces, byte fallback, 262k tokens, <bos> first.
TEST(TokenizerParity, Gemma3MatchesHuggingFace) { check_family("gemma3"); }
// Llama-2 / Mistral's normalizer (Prepend "▁", Replace) and decoder (Replace, ByteFallback, Fuse, Strip).
TEST(TokenizerParity, Llama2MatchesHuggingFace) { check_family("llama2"); }
// The same vocabulary with a Metaspace pre-tokenizer and decoder, as newer files write it.
TEST(TokenizerParity, Llama2WithMetaspaceFirstMatchesHuggingFace) { check_family("llama2_metaspace"); }
TEST(TokenizerParity, Llama2WithMetaspaceSplitAlwaysMatchesHuggingFace) { check_family("llama2_split"); }
// Three Split regexes before ByteLevel, 818 added tokens (some normalized, some not special).
TEST(TokenizerParity, DeepSeekV3MatchesHuggingFace) { check_family("deepseek_v3"); }
// o200k: a case-aware pattern and ignore_merges over 200k tokens.
TEST(TokenizerParity, GptOssMatchesHuggingFace) { check_family("gptoss"); }
TEST(TokenizerParity, Gpt2MatchesGpt3Encoder) { check_family("gpt2"); }
