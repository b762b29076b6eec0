#include "text/bpe.h"

#include "text/utf8.h"

#include <functional>
#include <mutex>
#include <queue>

namespace dflash::text {

BpeModel::BpeModel(std::array<int32_t, 256> byte_ids, std::unordered_map<uint64_t, Merge> merges,
                   TokenTable words, bool ignore_merges)
    : byte_ids_(byte_ids), merges_(std::move(merges)), words_(std::move(words)), ignore_merges_(ignore_merges) {}

BpeModel::BpeModel(CharSymbols chars, std::unordered_map<uint64_t, Merge> merges, TokenTable words,
                   bool ignore_merges)
    : byte_level_(false),
      chars_(std::move(chars)),
      merges_(std::move(merges)),
      words_(std::move(words)),
      ignore_merges_(ignore_merges) {}

void BpeModel::first_symbols(std::string_view piece, std::vector<int32_t>& ids) const {
  ids.clear();
  if (byte_level_) {
    for (char c : piece) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
    return;
  }
  // HF's merge_word: a pending unknown token is written when a known
  // character follows (not before byte-fallback tokens, which HF writes at
  // once), or at the end; with fuse_unk a run of unknowns is one.
  bool unknown_pending = false;
  for (std::size_t at = 0; at < piece.size();) {
    std::size_t bad = 0;
    std::size_t length = utf8::sequence_length(piece, at, bad);
    if (length == 0) length = bad;  // the pieces are valid UTF-8; kept safe all the same
    const std::string_view character = piece.substr(at, length);
    at += length;
    if (const int32_t* id = chars_.chars.find(character)) {
      if (unknown_pending) ids.push_back(chars_.unk_id);
      unknown_pending = false;
      ids.push_back(*id);
      continue;
    }
    if (chars_.byte_fallback) {
      bool all = true;
      for (char c : character) all = all && chars_.byte_ids[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : character) ids.push_back(chars_.byte_ids[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (chars_.unk_id < 0) continue;
    if (unknown_pending && !chars_.fuse_unk) ids.push_back(chars_.unk_id);
    unknown_pending = true;
  }
  if (unknown_pending) ids.push_back(chars_.unk_id);
}

void BpeModel::merge(std::string_view piece, std::vector<int32_t>& ids) const {
  first_symbols(piece, ids);
  const auto n = static_cast<int32_t>(ids.size());
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols(static_cast<std::size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    symbols[static_cast<std::size_t>(i)] = {ids[static_cast<std::size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1, true};
  ids.clear();

  // Candidates ordered by (rank, position): the lowest rank first, and of
  // equal ranks the leftmost. Entries made stale by earlier merges are
  // recognised when popped (the pair there no longer gives this merge).
  struct Candidate {
    int32_t rank, pos, id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto offer = [&](int32_t pos) {
    const Symbol& s = symbols[static_cast<std::size_t>(pos)];
    if (s.next < 0) return;
    const auto it = merges_.find(pair_key(s.id, symbols[static_cast<std::size_t>(s.next)].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) offer(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<std::size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(left.next)];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.id != top.id) continue;
    left.id = top.id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) offer(left.prev);
    offer(top.pos);
  }
  // The first symbol is never merged away (merges keep the left one).
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = symbols[static_cast<std::size_t>(i)].next)
    ids.push_back(symbols[static_cast<std::size_t>(i)].id);
}

void BpeModel::encode(const std::string& piece, std::vector<int64_t>& out) const {
  if (ignore_merges_) {
    // Llama-3: a pre-token that is a whole vocabulary entry is taken as is.
    if (const int32_t* id = words_.find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  if (merges_.empty()) {  // a byte tokenizer (or one without merges): nothing to merge or cache
    std::vector<int32_t> ids;
    first_symbols(piece, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  const bool cacheable = piece.size() < kCacheMaxPieceBytes;
  if (cacheable) {
    std::shared_lock<std::shared_mutex> lock(cache_mutex_);
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock<std::shared_mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheMaxEntries) cache_.emplace(piece, std::move(ids));
  }
}

}  // namespace dflash::text
