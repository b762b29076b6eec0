// tokenizer.json, the Hugging Face `tokenizers` serialization: which parts of
// it dflash-host reads (docs/tokenizer.md) and the checks that make a file we
// cannot encode exactly like HF fail at load, naming the key.
#include "text/bpe_vocab.h"
#include "text/readers.h"
#include "text/utf8.h"

#include <map>
#include <memory>

namespace dflash::text::detail {
namespace {

const char* const kFamilies =
    "dflash-host reads BPE tokenizers: byte-level (GPT-2, Qwen2/Qwen3, Llama-3, DeepSeek-V3, gpt-oss) and "
    "SentencePiece-style (Llama-2, Mistral, Gemma); see docs/tokenizer.md";

// {"String": "..."} (a literal) or {"Regex": "..."}: Split's, Replace's pattern.
std::shared_ptr<const unicode::Regex> read_pattern(const Fields& f) {
  const Fields pattern(f.file(), f.object("pattern"), f.key("pattern"));
  const bool regex = pattern.has("Regex"), literal = pattern.has("String");
  if (regex == literal) f.fail("pattern", "must hold exactly one of \"Regex\" and \"String\"");
  const char* which = regex ? "Regex" : "String";
  const std::string text = pattern.string(which);
  if (literal && text.empty()) pattern.fail(which, "is empty; a pattern must match something");
  try {
    return std::make_shared<const unicode::Regex>(text, literal, f.file().string() + " (" + pattern.key(which) + ")");
  } catch (const std::invalid_argument& e) {
    pattern.fail(which, std::string(e.what()) + "; the pattern must be one ICU's regex syntax accepts");
  }
}

// A field that holds one character ("▁", " "): Metaspace's replacement, Strip's content.
std::string one_character(const Fields& f, const char* name) {
  const std::string text = f.string(name);
  std::size_t bad = 0;
  if (text.empty() || utf8::sequence_length(text, 0, bad) != text.size())
    f.fail(name, json(text).dump() + " must be one character");
  return text;
}

void read_normalizer(const json& value, const fs::path& file, const std::string& key, Normalizer& out) {
  if (value.is_null()) return;
  const Fields f(file, value, key);
  const std::string type = f.string("type");
  if (type == "Sequence") {
    const json& list = f.array("normalizers");
    for (std::size_t i = 0; i < list.size(); ++i) read_normalizer(list[i], file, index_of(f.key("normalizers"), i), out);
  } else if (type == "NFC") {
    out.add_form(unicode::Form::kNFC);
  } else if (type == "NFD") {
    out.add_form(unicode::Form::kNFD);
  } else if (type == "NFKC") {
    out.add_form(unicode::Form::kNFKC);
  } else if (type == "NFKD") {
    out.add_form(unicode::Form::kNFKD);
  } else if (type == "Replace") {
    out.add_replace(read_pattern(f), f.string("content"));
  } else if (type == "Prepend") {
    out.add_prepend(f.string("prepend"));
  } else {
    f.fail("type", "the normalizer \"" + type + "\" is not supported (supported: NFC, NFD, NFKC, NFKD, Replace, "
                   "Prepend and a Sequence of them); " + kFamilies);
  }
}

// Metaspace's prepend_scheme, or the add_prefix_space of files written before it.
PrependScheme read_prepend_scheme(const Fields& f) {
  if (!f.has("prepend_scheme")) return f.boolean("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
  const std::string scheme = f.string("prepend_scheme");
  if (scheme == "always") return PrependScheme::kAlways;
  if (scheme == "first") return PrependScheme::kFirst;
  if (scheme == "never") return PrependScheme::kNever;
  f.fail("prepend_scheme", json(scheme).dump() + " is not a prepend scheme (always, first or never)");
}

MetaspaceStep read_metaspace(const Fields& f) {
  MetaspaceStep step;
  step.replacement = one_character(f, "replacement");
  step.prepend_scheme = read_prepend_scheme(f);
  step.split = f.boolean("split", true);
  return step;
}

SplitBehavior read_behavior(const Fields& f) {
  static const std::map<std::string, SplitBehavior> kBehaviors = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous}};
  const std::string name = f.string("behavior");
  const auto it = kBehaviors.find(name);
  if (it == kBehaviors.end())
    f.fail("behavior", "\"" + name + "\" is not a split behavior (Removed, Isolated, MergedWithPrevious, "
                       "MergedWithNext or Contiguous)");
  return it->second;
}

SplitStep read_split(const Fields& f) {
  SplitStep step;
  step.pattern = read_pattern(f);
  step.behavior = read_behavior(f);
  step.invert = f.boolean("invert", false);
  return step;
}

void read_pre_tokenizer(const json& value, const fs::path& file, const std::string& key, PreTokenizer& out) {
  if (value.is_null()) return;  // the normalized text is one piece (Llama-2's files)
  const Fields f(file, value, key);
  const std::string type = f.string("type");
  if (type == "Sequence") {
    const json& list = f.array("pretokenizers");
    for (std::size_t i = 0; i < list.size(); ++i) read_pre_tokenizer(list[i], file, index_of(f.key("pretokenizers"), i), out);
    return;
  }
  // ByteLevel turns text into byte characters; a step after it would see those.
  if (out.has_byte_level())
    f.fail("type", "a \"" + type + "\" step after ByteLevel is not supported: ByteLevel must be the last pre-tokenizer");
  if (type == "ByteLevel") {
    ByteLevelStep step;
    step.add_prefix_space = f.boolean("add_prefix_space");
    step.use_regex = f.boolean("use_regex", true);
    out.add(step);
  } else if (type == "Split") {
    out.add(read_split(f));
  } else if (type == "Metaspace") {
    out.add(read_metaspace(f));
  } else {
    f.fail("type", "the pre-tokenizer \"" + type + "\" is not supported (supported: ByteLevel, Split, Metaspace and a "
                   "Sequence of them); " + kFamilies);
  }
}

// Merges are "left right" strings (older files) or ["left", "right"] pairs;
// merges[index] of the list at `list_key`.
std::array<int32_t, 3> read_merge(const json& m, const TokenTable& vocab,
                                  const fs::path& file, const std::string& list_key, std::size_t index) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const auto merge = split_merge(s);
    if (!merge)
      fail(file, index_of(list_key, index), json(s).dump() + " is not a merge: it must be two tokens separated by one space");
    return resolve_merge(vocab, merge->first, merge->second, file, list_key, index);
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return resolve_merge(vocab, m[0].get_ref<const std::string&>(), m[1].get_ref<const std::string&>(), file, list_key,
                         index);
  fail(file, index_of(list_key, index),
       "must be \"left right\" or [\"left\", \"right\"], not " + describe(m) + " (" + m.dump() + ")");
}

void read_model(const Fields& root, StreamedModel& streamed, Components& c) {
  const Fields f(root.file(), root.object("model"), "model");
  const std::string type = f.has("type") ? f.string("type") : (f.has("merges") ? "BPE" : "");
  if (type != "BPE") {
    const std::string what = type.empty() ? "a model without \"type\"" : "the model type \"" + type + "\"";
    const std::string family = type == "WordPiece"  ? " (BERT-style)"
                               : type == "Unigram"  ? " (SentencePiece's unigram model: T5, ALBERT, XLM-R)"
                               : type == "WordLevel" ? " (a word list)"
                                                     : "";
    f.fail("type", what + family + " is not supported; " + kFamilies);
  }
  c.byte_fallback = f.boolean("byte_fallback", false);
  c.fuse_unk = f.boolean("fuse_unk", false);
  if (f.has("dropout")) {
    const json& d = f.required("dropout");
    if (!d.is_number() || d.get<double>() != 0.0)
      f.fail("dropout", d.dump() + ": BPE dropout makes encoding random (a training-time option); set it to null");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (f.has(affix) && !(f.required(affix).is_string() && f.string(affix).empty()))
      f.fail(affix, f.required(affix).dump() + ": subword prefixes and suffixes (WordPiece-style BPE) are not supported; " +
                        kFamilies);
  c.vocab = streamed.has_vocab ? streamed.vocab.finish() : read_vocab(f.required("vocab"), f.file(), f.key("vocab"));
  const json::array_t& list =
      streamed.has_merges ? streamed.merges : f.array("merges").get_ref<const json::array_t&>();
  c.merges.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) c.merges.push_back(read_merge(list[i], c.vocab, f.file(), f.key("merges"), i));
  c.ignore_merges = f.boolean("ignore_merges", false);
  if (f.has("unk_token")) {
    const std::string unk = f.string("unk_token");
    const int32_t* id = c.vocab.find(unk);
    if (id == nullptr)
      f.fail("unk_token", json(unk).dump() + " is not in model.vocab; the unknown token must be one of its tokens");
    c.unk_id = *id;
  }
}

void read_added_tokens(const Fields& root, Components& c) {
  if (!root.has("added_tokens")) return;
  const json& list = root.array("added_tokens");
  std::map<int32_t, std::string> by_id;
  std::map<std::string, int32_t> by_content;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Fields f(root.file(), list[i], index_of("added_tokens", i));
    AddedToken t;
    t.id = token_id(f.required("id"), f.file(), f.key("id"));
    t.content = f.string("content");
    if (t.content.empty()) f.fail("content", "is empty; an added token needs text to match");
    t.special = f.boolean("special", false);
    t.lstrip = f.boolean("lstrip", false);
    t.rstrip = f.boolean("rstrip", false);
    t.single_word = f.boolean("single_word", false);
    t.normalized = f.boolean("normalized", !t.special);  // HF's default for tokens made with AddedToken::from
    const auto id = static_cast<int32_t>(t.id);
    if (const auto it = by_id.find(id); it != by_id.end())
      f.fail("id", std::to_string(id) + " is also the id of the added token " + json(it->second).dump() +
                       "; each id names one token");
    if (const auto it = by_content.find(t.content); it != by_content.end())
      f.fail("content", json(t.content).dump() + " is also added with id " + std::to_string(it->second) +
                            "; each added token appears once");
    if (const int32_t* in_vocab = c.vocab.find(t.content); in_vocab && *in_vocab != id)
      f.fail("id", std::to_string(id) + " differs from the id " + std::to_string(*in_vocab) + " that model.vocab gives " +
                       json(t.content).dump() + "; they must agree");
    by_id.emplace(id, t.content);
    by_content.emplace(t.content, id);
    c.added.push_back(std::move(t));
  }
  // An id of the vocabulary cannot be taken by different added text.
  for (const auto& [token, id] : c.vocab) {
    const auto it = by_id.find(id);
    if (it == by_id.end() || it->second == token) continue;
    std::size_t i = 0;
    while (c.added[i].id != id) ++i;
    fail(root.file(), index_of("added_tokens", i) + ".id",
         std::to_string(id) + " is the id of the vocabulary's token " + json(token).dump() + ", not of " +
             json(it->second).dump() + "; added tokens take ids of their own");
  }
}

bool known_id(const Components& c, int64_t id) {
  for (const auto& t : c.added)
    if (t.id == id) return true;
  for (const auto& [token, v] : c.vocab)
    if (v == id) return true;
  return false;
}

// The ids of one of TemplateProcessing's special_tokens, by name.
std::vector<int64_t> template_special(const Fields& t, const std::string& name, const Components& c) {
  const Fields specials(t.file(), t.object("special_tokens"), t.key("special_tokens"));
  if (!specials.has(name))
    t.fail("special_tokens", "has no entry " + json(name).dump() + ", which the template uses; add it");
  const Fields entry(t.file(), specials.object(name), specials.key(name));
  const json& ids = entry.array("ids");
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = token_id(ids[i], t.file(), index_of(entry.key("ids"), i));
    if (!known_id(c, id))
      fail(t.file(), index_of(entry.key("ids"), i),
           std::to_string(id) + " is not a token of this tokenizer (neither in model.vocab nor in added_tokens)");
    out.push_back(id);
  }
  return out;
}

// "single": [{"SpecialToken": {"id": "<|begin_of_text|>"}}, {"Sequence": {"id": "A"}}]
void read_template(const Fields& t, Components& c) {
  const json& single = t.array("single");
  bool seen_text = false;
  std::vector<int64_t> before, after;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const Fields item(t.file(), single[i], index_of(t.key("single"), i));
    if (item.has("Sequence")) {
      const Fields seq(t.file(), item.object("Sequence"), item.key("Sequence"));
      if (seq.string("id") != "A") seq.fail("id", "must be \"A\" in the single-sequence template");
      if (seen_text) item.fail("Sequence", "the text (\"A\") appears twice in the template");
      seen_text = true;
    } else if (item.has("SpecialToken")) {
      const Fields special(t.file(), item.object("SpecialToken"), item.key("SpecialToken"));
      const std::vector<int64_t> ids = template_special(t, special.string("id"), c);
      std::vector<int64_t>& side = seen_text ? after : before;
      side.insert(side.end(), ids.begin(), ids.end());
    } else {
      fail(t.file(), item.key(), "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_text) t.fail("single", "does not place the text ({\"Sequence\": {\"id\": \"A\"}})");
  if (c.has_template) t.fail("type", "a second template; a post-processor Sequence may hold one");
  c.has_template = true;
  c.template_before = std::move(before);
  c.template_after = std::move(after);
}

// RobertaProcessing / BertProcessing: "cls": ["<s>", 0], "sep": ["</s>", 2] around the text.
void read_cls_sep(const Fields& p, Components& c) {
  std::vector<int64_t> ids;
  for (const char* name : {"cls", "sep"}) {
    const json& v = p.array(name);
    if (v.size() != 2 || !v[0].is_string()) p.fail(name, "must be [\"token\", id]");
    const int32_t id = token_id(v[1], p.file(), index_of(p.key(name), 1));
    if (!known_id(c, id)) p.fail(name, std::to_string(id) + " is not a token of this tokenizer");
    ids.push_back(id);
  }
  if (c.has_template) p.fail("type", "a second template; a post-processor Sequence may hold one");
  c.has_template = true;
  c.template_before = {ids[0]};
  c.template_after = {ids[1]};
}

void read_post_processor(const json& value, const fs::path& file, const std::string& key, Components& c) {
  if (value.is_null()) return;
  const Fields f(file, value, key);
  const std::string type = f.string("type");
  if (type == "Sequence") {
    const json& list = f.array("processors");
    for (std::size_t i = 0; i < list.size(); ++i) read_post_processor(list[i], file, index_of(f.key("processors"), i), c);
  } else if (type == "ByteLevel") {
    // Only moves offsets; ids are unchanged.
  } else if (type == "TemplateProcessing") {
    read_template(f, c);
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    read_cls_sep(f, c);
  } else {
    f.fail("type", "the post-processor \"" + type + "\" is not supported (supported: ByteLevel, TemplateProcessing, "
                   "RobertaProcessing, BertProcessing and a Sequence of them)");
  }
}

std::size_t count(const Fields& f, const char* name) {
  const json& v = f.required(name);
  if (!v.is_number_unsigned()) f.fail(name, "must be a count (an integer of 0 or more), not " + v.dump());
  return v.get<std::size_t>();
}

void read_decoder(const json& value, const fs::path& file, const std::string& key, Decoder& out) {
  if (value.is_null())
    fail(file, key, std::string("is null; the decoder turns tokens back into text: a byte-level BPE has "
                                "{\"type\": \"ByteLevel\"}; ") + kFamilies);
  const Fields f(file, value, key);
  const std::string type = f.string("type");
  if (type == "Sequence") {
    const json& list = f.array("decoders");
    for (std::size_t i = 0; i < list.size(); ++i) read_decoder(list[i], file, index_of(f.key("decoders"), i), out);
  } else if (type == "ByteLevel") {
    out.add_byte_level();
  } else if (type == "Replace") {
    out.add_replace(read_pattern(f), f.string("content"));
  } else if (type == "ByteFallback") {
    out.add_byte_fallback();
  } else if (type == "Fuse") {
    out.add_fuse();
  } else if (type == "Strip") {
    const std::string content = one_character(f, "content");
    out.add_strip(utf8::code_point(content, 0, content.size()), count(f, "start"), count(f, "stop"));
  } else if (type == "Metaspace") {
    const MetaspaceStep step = read_metaspace(f);
    out.add_metaspace(step.replacement, step.prepend_scheme != PrependScheme::kNever);
  } else {
    f.fail("type", "the decoder \"" + type + "\" is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, "
                   "Strip, Metaspace and a Sequence of them); " + kFamilies);
  }
}

}  // namespace

std::vector<json_text::Stream> StreamedModel::streams() {
  json_text::Stream vocab_stream{{"model", "vocab"}, /*is_array=*/false,
                                 [this](std::string& token, std::size_t, json&& id) {
                                   has_vocab = true;
                                   return vocab.add(token, id);
                                 }};
  json_text::Stream merges_stream{{"model", "merges"}, /*is_array=*/true,
                                  [this](std::string&, std::size_t, json&& merge) {
                                    has_merges = true;
                                    merges.push_back(std::move(merge));
                                    return true;
                                  }};
  return {std::move(vocab_stream), std::move(merges_stream)};
}

Components read_tokenizer_json(const json& root, const fs::path& file, StreamedModel& streamed) {
  const Fields f(file, root, "");
  if (!f.has("model"))
    fail(file, "model", "missing: this is not a Hugging Face tokenizer.json (for GPT-2's encoder.json + vocab.bpe, "
                        "give the directory holding both)");
  Components c;
  c.source = file;
  read_model(f, streamed, c);
  read_added_tokens(f, c);
  read_normalizer(root.contains("normalizer") ? root.at("normalizer") : json(), file, "normalizer", c.normalizer);
  read_pre_tokenizer(root.contains("pre_tokenizer") ? root.at("pre_tokenizer") : json(), file, "pre_tokenizer",
                     c.pre_tokenizer);
  // A ByteLevel step turns text into byte characters: the vocabulary must
  // spell every byte. Without one, BPE starts from characters.
  if (c.pre_tokenizer.has_byte_level()) check_byte_alphabet(c.vocab, file, "model.vocab");
  read_post_processor(root.contains("post_processor") ? root.at("post_processor") : json(), file, "post_processor", c);
  read_decoder(root.contains("decoder") ? root.at("decoder") : json(), file, "decoder", c.decoder);
  return c;
}

}  // namespace dflash::text::detail
