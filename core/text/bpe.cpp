#include "text/bpe.h"

#include <functional>
#include <mutex>
#include <queue>

namespace dflash::text {

BpeModel::BpeModel(std::array<int32_t, 256> byte_ids, std::unordered_map<uint64_t, Merge> merges,
                   TokenTable words, bool ignore_merges)
    : byte_ids_(byte_ids), merges_(std::move(merges)), words_(std::move(words)), ignore_merges_(ignore_merges) {}

void BpeModel::merge(std::string_view piece, std::vector<int32_t>& ids) const {
  ids.clear();
  const auto n = static_cast<int32_t>(piece.size());
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols(static_cast<std::size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    symbols[static_cast<std::size_t>(i)] = {byte_ids_[static_cast<unsigned char>(piece[static_cast<std::size_t>(i)])],
                                            i - 1, i + 1 < n ? i + 1 : -1, true};

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
  if (merges_.empty()) {  // a byte tokenizer: nothing to merge or cache
    for (char c : piece) out.push_back(byte_ids_[static_cast<unsigned char>(c)]);
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
