// SentencePiece-style BPE (Llama-2, Mistral, Gemma) on a hand-made
// tokenizer.json whose answers are worked out by hand: spaces written as "▁"
// by the normalizer (Prepend + Replace) or by Metaspace, symbols that are
// characters, byte fallback, the unknown token (fused or not), and the
// decoders that read it all back. Each expected value was also checked with
// Hugging Face's Rust tokenizers (npm tokenizers 0.23.2) on the same file.
#include "text/decoder.h"
#include "text/normalizer.h"
#include "text/pre_tokenizer.h"
#include "text/tokenizer.h"
#include "core/text/tiny_tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using dflash::test::load_json;
using dflash::test::tiny_sentencepiece_json;
using dflash::text::Tokenizer;
using Ids = std::vector<int64_t>;
using nlohmann::json;

namespace {

const char* const kMark = "\xE2\x96\x81";  // ▁, U+2581

// The same vocabulary with a Metaspace pre-tokenizer and decoder instead of
// the normalizer, as newer Llama / Mistral files write it.
json with_metaspace(const char* prepend_scheme, bool split) {
  json j = tiny_sentencepiece_json(true);
  const json metaspace = {{"type", "Metaspace"}, {"replacement", kMark}, {"prepend_scheme", prepend_scheme}, {"split", split}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = metaspace;
  j["decoder"] = metaspace;
  return j;
}

}  // namespace

TEST(SentencePiece, CharactersMergeByRankAfterTheNormalizerWritesSpacesAsTheMark) {
  const Tokenizer t = load_json(tiny_sentencepiece_json(true));
  // "▁hi▁there": ▁t (rank 0), he, ▁the, ▁h, ▁hi, re, then ▁there.
  EXPECT_EQ(t.encode("hi there"), (Ids{24, 26}));
  EXPECT_EQ(t.encode("hi there", true), (Ids{1, 24, 26}));
  // Two spaces are ▁▁: the first stays alone (no merge takes ▁ before ▁).
  EXPECT_EQ(t.encode("hi  there "), (Ids{24, 10, 26, 10}));
  // Prepend applies to every stretch between added tokens, as Llama-2's legacy files do.
  EXPECT_EQ(t.encode("<s>hi"), (Ids{1, 24}));
  EXPECT_EQ(t.encode("hi</s>there"), (Ids{24, 2, 26}));
  EXPECT_EQ(t.encode(""), (Ids{}));  // Prepend leaves empty text empty
}

TEST(SentencePiece, UnknownCharactersFallBackToBytesElseTheUnknownToken) {
  const Tokenizer fused = load_json(tiny_sentencepiece_json(true)), apart = load_json(tiny_sentencepiece_json(false));
  EXPECT_EQ(fused.encode("\xC3\xA9"), (Ids{10, 3, 4}));                       // é: its two bytes' tokens
  EXPECT_EQ(fused.encode("\xF0\x9F\x98\x80"), (Ids{10, 5, 6, 7, 8}));         // 😀: four
  // 中 has a byte (E4) without a token: the unknown token, one for a run when fused.
  EXPECT_EQ(fused.encode("\xE4\xB8\xAD\xE4\xB8\xADx"), (Ids{10, 0, 16}));
  EXPECT_EQ(apart.encode("\xE4\xB8\xAD\xE4\xB8\xADx"), (Ids{10, 0, 0, 16}));
  EXPECT_EQ(fused.encode("qq"), (Ids{10, 0}));
  EXPECT_EQ(apart.encode("qq"), (Ids{10, 0, 0}));
  // As HF: byte-fallback tokens go in at once, before an unknown token still pending.
  EXPECT_EQ(fused.encode("\xE4\xB8\xAD\xC3\xA9"), (Ids{10, 3, 4, 0}));
  // Without byte fallback or an unknown token, a character without a token is dropped, as HF drops it.
  json plain = tiny_sentencepiece_json(true);
  plain["model"]["byte_fallback"] = false;
  plain["model"]["unk_token"] = nullptr;
  EXPECT_EQ(load_json(plain).encode("x\xC3\xA9x"), (Ids{10, 16, 16}));
}

TEST(SentencePiece, TheDecoderChainReadsTheMarkBytesAndTheStrippedSpaceBack) {
  const Tokenizer t = load_json(tiny_sentencepiece_json(true));
  EXPECT_EQ(t.decode({24, 26}), "hi there");  // Replace, Fuse, then Strip takes the first space
  EXPECT_EQ(t.decode({1, 24, 26}), "<s> hi there");  // the first token is <s>: nothing to strip
  EXPECT_EQ(t.decode({10, 10, 24}), "  hi");
  EXPECT_EQ(t.decode({1, 24, 26}, /*skip_special_tokens=*/true), "hi there");
  EXPECT_EQ(t.decode({3, 4}), "\xC3\xA9");
  // A run of byte tokens that is not UTF-8 is one U+FFFD a byte (HF's ByteFallback), not from_utf8_lossy's one per subpart.
  EXPECT_EQ(t.decode({3}), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode({3, 3, 4}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(t.decode({5, 6, 7}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  for (const char* text : {"hi there", "hi  there ", "\xC3\xA9x", "\xF0\x9F\x98\x80 x"}) EXPECT_EQ(t.decode(t.encode(text)), text);
}

TEST(SentencePiece, MetaspacePrependsAtTheInputsStartOnlyWhenFirst) {
  const Tokenizer first = load_json(with_metaspace("first", false));
  EXPECT_EQ(first.encode("hi there"), (Ids{24, 26}));
  // After an added token the stretch does not begin the input: no ▁ before "hi".
  EXPECT_EQ(first.encode("<s>hi"), (Ids{1, 11, 12}));
  EXPECT_EQ(first.encode("hi</s>there"), (Ids{24, 2, 13, 21, 25}));  // t he re: no ▁ before "there"
  const Tokenizer always = load_json(with_metaspace("always", false));
  EXPECT_EQ(always.encode("<s>hi"), (Ids{1, 24}));
  const Tokenizer never = load_json(with_metaspace("never", false));
  EXPECT_EQ(never.encode("hi there"), (Ids{11, 12, 26}));
}

TEST(SentencePiece, MetaspaceSplitsBeforeEachMarkAndItsDecoderDropsTheFirstTokensMarks) {
  const Tokenizer split = load_json(with_metaspace("always", true));
  // "▁hi▁▁there" is cut ▁hi | ▁ | ▁there.
  EXPECT_EQ(split.encode("hi  there"), (Ids{24, 10, 26}));
  EXPECT_EQ(split.decode({24, 10, 26}), "hi  there");
  // HF's Metaspace decoder drops every ▁ of the first token when it prepends, not only a leading one.
  EXPECT_EQ(split.decode({10, 10, 24}), "  hi");
  EXPECT_EQ(split.decode({10, 24}), " hi");
  const Tokenizer never = load_json(with_metaspace("never", true));
  EXPECT_EQ(never.decode({10, 24}), "  hi");
}

TEST(SentencePiece, NormalizerStepsRunInOrder) {
  using dflash::text::Normalizer;
  Normalizer n;
  n.add_replace(std::make_shared<const dflash::text::unicode::Regex>("\\s+", false), " ");
  n.add_prepend(kMark);
  n.add_replace(std::make_shared<const dflash::text::unicode::Regex>(" ", true), kMark);
  EXPECT_EQ(n.apply("a \t\n b"), std::string(kMark) + "a" + kMark + "b");
  EXPECT_EQ(n.apply(""), "");
  Normalizer nfkc;
  nfkc.add_form(dflash::text::unicode::Form::kNFKC);
  EXPECT_EQ(nfkc.apply("\xEF\xAC\x81"), "fi");  // the ligature ﬁ
}
