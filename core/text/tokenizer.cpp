#include "text/tokenizer.h"

#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/readers.h"
#include "text/utf8.h"

#include <algorithm>
#include <cstdio>

namespace dflash::text {

namespace fs = std::filesystem;
using detail::Components;

struct Tokenizer::Impl {
  fs::path source;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  std::unique_ptr<BpeModel> bpe;
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized=false, found in the raw text
  AddedTokenMatcher normalized_matcher;  // the others, found in normalized text
  bool has_template = false;
  std::vector<int64_t> template_before, template_after;

  // Every token by its spelling (the vocabulary's, and the added tokens').
  TokenTable by_spelling;
  // By id (0 .. vocab_size-1): the spelling id_to_token gives (a view of
  // by_spelling's, which no longer changes), the bytes decode emits, and
  // whether the id names a token at all / a special one.
  std::vector<std::string_view> spelling;
  std::vector<std::string> bytes;
  std::vector<uint8_t> exists, special;

  explicit Impl(Components c);

  // at_start: the text begins the input (Metaspace's "first" prepends there).
  void encode_text(std::string_view text, bool at_start, std::vector<int64_t>& ids) const;
  void encode_normalized(std::string_view text, bool at_start, std::vector<int64_t>& ids) const;
};

namespace {

// A character-level BPE's first symbols: the one-character tokens, the
// "<0xHH>" byte tokens, the unknown token.
BpeModel::CharSymbols char_symbols(const Components& c) {
  BpeModel::CharSymbols symbols;
  for (const auto& [token, id] : c.vocab) {
    std::size_t bad = 0;
    std::string spelling = token;
    if (!token.empty() && utf8::sequence_length(token, 0, bad) == token.size()) symbols.chars.insert(spelling, id);
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);  // as HF spells them: format!("<{b:#04X}>")
    const int32_t* id = c.vocab.find(name);
    symbols.byte_ids[static_cast<std::size_t>(b)] = id ? *id : -1;
  }
  symbols.byte_fallback = c.byte_fallback;
  symbols.unk_id = c.unk_id;
  symbols.fuse_unk = c.fuse_unk;
  return symbols;
}

// byte_symbols: the pre-tokenizer has a ByteLevel step, so BPE starts from bytes.
std::unique_ptr<BpeModel> make_bpe(const Components& c, bool byte_symbols) {
  std::unordered_map<uint64_t, BpeModel::Merge> merges;
  merges.reserve(c.merges.size());
  for (std::size_t rank = 0; rank < c.merges.size(); ++rank) {
    const auto& [left, right, merged] = c.merges[rank];
    // A merge listed twice keeps its later rank, as HF's map does.
    merges[BpeModel::pair_key(left, right)] = {static_cast<int32_t>(rank), merged};
  }
  // ignore_merges looks a pre-token up whole: by its bytes where the
  // vocabulary spells bytes as characters, else by its spelling.
  TokenTable words;
  if (c.ignore_merges) {
    words.reserve(c.vocab.size());
    for (const auto& [token, id] : c.vocab) {
      std::optional<std::string> key = byte_symbols ? byte_level::to_bytes(token) : std::optional<std::string>(token);
      if (key) words.insert(*key, id);
    }
  }
  if (!byte_symbols) return std::make_unique<BpeModel>(char_symbols(c), std::move(merges), std::move(words), c.ignore_merges);
  std::array<int32_t, 256> byte_ids{};
  for (int b = 0; b < 256; ++b) byte_ids[b] = *c.vocab.find(byte_level::char_of(static_cast<std::uint8_t>(b)));
  return std::make_unique<BpeModel>(byte_ids, std::move(merges), std::move(words), c.ignore_merges);
}

}  // namespace

Tokenizer::Impl::Impl(Components c)
    : source(c.source),
      normalizer(std::move(c.normalizer)),
      pre_tokenizer(std::move(c.pre_tokenizer)),
      decoder(std::move(c.decoder)),
      bpe(make_bpe(c, pre_tokenizer.has_byte_level())),
      added(std::move(c.added)),
      has_template(c.has_template),
      template_before(std::move(c.template_before)),
      template_after(std::move(c.template_after)),
      by_spelling(std::move(c.vocab)) {
  int64_t size = 0;
  for (const auto& [token, id] : by_spelling) size = std::max<int64_t>(size, id + 1);
  for (const AddedToken& t : added) size = std::max<int64_t>(size, t.id + 1);
  const auto n = static_cast<std::size_t>(size);
  spelling.resize(n);
  // Each token's bytes serve decode's ByteLevel-only path; other decoders work on spellings.
  const bool byte_level_decode = decoder.only_byte_level();
  if (byte_level_decode) bytes.resize(n);
  exists.assign(n, 0);
  special.assign(n, 0);
  for (const auto& [token, id] : by_spelling) {
    const auto i = static_cast<std::size_t>(id);
    if (byte_level_decode) bytes[i] = byte_level::decoded(token);
    exists[i] = 1;
  }
  for (std::size_t k = 0; k < added.size(); ++k) {
    const AddedToken& t = added[k];
    const auto i = static_cast<std::size_t>(t.id);
    // HF decodes an added token from the form it is matched in: normalized
    // tokens as the normalizer writes them.
    const std::string matched = t.normalized && !normalizer.empty() ? normalizer.apply(t.content) : t.content;
    // Added tokens first, as HF's token_to_id (the loader made sure a vocabulary entry of the same text has the same id).
    by_spelling.assign(t.content, t.id);
    if (byte_level_decode) bytes[i] = byte_level::decoded(matched);
    exists[i] = 1;
    special[i] = t.special ? 1 : 0;
    (t.normalized ? normalized_matcher : raw_matcher).add(matched, static_cast<int32_t>(k), t);
  }
  // Each id has one spelling: the loader refused an added token taking a vocabulary id with other text.
  for (const auto& [token, id] : by_spelling) spelling[static_cast<std::size_t>(id)] = token;
}

void Tokenizer::Impl::encode_normalized(std::string_view text, bool at_start, std::vector<int64_t>& ids) const {
  std::vector<std::string> pieces;
  pre_tokenizer.run(text, pieces, at_start);
  for (const std::string& piece : pieces) bpe->encode(piece, ids);
}

// One stretch of raw text between non-normalized added tokens: normalize it,
// find the normalized added tokens, pre-tokenize and merge the rest.
void Tokenizer::Impl::encode_text(std::string_view text, bool at_start, std::vector<int64_t>& ids) const {
  const std::string normalized = normalizer.empty() ? std::string(text) : normalizer.apply(text);
  if (normalized_matcher.empty()) {
    encode_normalized(normalized, at_start, ids);
    return;
  }
  std::vector<Segment> segments;
  normalized_matcher.split(normalized, segments);
  for (const Segment& s : segments) {
    if (s.token >= 0)
      ids.push_back(added[static_cast<std::size_t>(s.token)].id);
    else
      encode_normalized(std::string_view(normalized).substr(s.begin, s.end - s.begin), at_start && s.begin == 0, ids);
  }
}

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const fs::path& file_or_dir) {
  std::error_code ec;
  fs::path file = file_or_dir;
  if (fs::is_directory(file_or_dir, ec)) {
    const auto has = [&](const char* name) { return fs::exists(file_or_dir / name, ec); };
    if (has("tokenizer.json")) {
      file = file_or_dir / "tokenizer.json";
    } else if (has("encoder.json") && has("vocab.bpe")) {
      return Tokenizer(std::make_shared<const Impl>(
          detail::read_gpt2_files(file_or_dir / "encoder.json", file_or_dir / "vocab.bpe")));
    } else if (has("vocab.json") && has("merges.txt")) {
      return Tokenizer(std::make_shared<const Impl>(
          detail::read_gpt2_files(file_or_dir / "vocab.json", file_or_dir / "merges.txt")));
    } else {
      throw TokenizerError(file_or_dir, "",
                           "the directory holds no tokenizer.json (nor GPT-2's encoder.json + vocab.bpe, nor "
                           "vocab.json + merges.txt); point at a Hugging Face model directory or a tokenizer.json file");
    }
  }
  const std::string text = detail::read_file(file);
  detail::StreamedModel streamed(file, text.size());
  const detail::json root = detail::parse_json(text, file, streamed.streams());
  if (root.is_object() && root.contains("type") && root["type"] == "bytes")
    return Tokenizer(std::make_shared<const Impl>(detail::read_bytes_format(root, file)));
  return Tokenizer(std::make_shared<const Impl>(detail::read_tokenizer_json(root, file, streamed)));
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::make_valid(text);
    text = repaired;
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  const bool wrap = add_special_tokens && m.has_template;
  if (wrap) ids.insert(ids.end(), m.template_before.begin(), m.template_before.end());
  if (m.raw_matcher.empty()) {
    m.encode_text(text, true, ids);
  } else {
    std::vector<Segment> segments;
    m.raw_matcher.split(text, segments);
    for (const Segment& s : segments) {
      if (s.token >= 0)
        ids.push_back(m.added[static_cast<std::size_t>(s.token)].id);
      else
        m.encode_text(text.substr(s.begin, s.end - s.begin), s.begin == 0, ids);
    }
  }
  if (wrap) ids.insert(ids.end(), m.template_after.begin(), m.template_after.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  const auto kept = [&](int64_t id) {
    if (id < 0 || id >= static_cast<int64_t>(m.exists.size())) return false;
    const auto i = static_cast<std::size_t>(id);
    return m.exists[i] && !(skip_special_tokens && m.special[i]);
  };
  if (m.decoder.only_byte_level()) {  // each token's bytes were worked out at load
    std::string out;
    for (int64_t id : ids)
      if (kept(id)) out += m.bytes[static_cast<std::size_t>(id)];
    return utf8::is_valid(out) ? out : utf8::make_valid(out);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids)
    if (kept(id)) tokens.emplace_back(m.spelling[static_cast<std::size_t>(id)]);
  return m.decoder.decode(std::move(tokens));
}

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  const int32_t* id = impl_->by_spelling.find(token);
  if (id == nullptr) return std::nullopt;
  return *id;
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->exists[static_cast<std::size_t>(id)]) return std::nullopt;
  return std::string(impl_->spelling[static_cast<std::size_t>(id)]);
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->exists.size()); }

const fs::path& Tokenizer::source() const { return impl_->source; }

bool Tokenizer::is_special(int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[static_cast<std::size_t>(id)] != 0;
}

}  // namespace dflash::text
