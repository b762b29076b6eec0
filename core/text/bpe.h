// BPE: a pre-token starts as one symbol per byte (byte-level BPE: the
// vocabulary's byte tokens) or per character (SentencePiece-style BPE: the
// character's token, else its bytes' "<0xHH>" tokens with byte fallback, else
// the unknown token), and the adjacent pair of lowest merge rank is merged,
// leftmost first, until none is left (HF's BPE::merge_word and
// Word::merge_all). Results of short pre-tokens are cached, as HF does, since
// text repeats its words.
#pragma once

#include "text/token_table.h"

#include <array>
#include <cstdint>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dflash::text {

class BpeModel {
 public:
  struct Merge {
    int32_t rank = 0;
    int32_t id = 0;  // the merged token
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  // A SentencePiece-style BPE's first symbols: characters, with their fallbacks.
  struct CharSymbols {
    TokenTable chars;                     // the vocabulary's one-character tokens
    std::array<int32_t, 256> byte_ids{};  // "<0xHH>" of each byte, -1 where absent; used with byte_fallback
    bool byte_fallback = false;
    int32_t unk_id = -1;                  // -1: no unknown token (an unknown character is dropped, as HF does)
    bool fuse_unk = false;                // a run of unknown characters is one unknown token
  };

  // Byte-level. byte_ids: the token of each byte. merges: (left, right) ids →
  // rank and merged id. words: the vocabulary by what a pre-token holds (raw
  // bytes), consulted first when ignore_merges.
  BpeModel(std::array<int32_t, 256> byte_ids, std::unordered_map<uint64_t, Merge> merges, TokenTable words,
           bool ignore_merges);
  // Character-level; words by spelling.
  BpeModel(CharSymbols chars, std::unordered_map<uint64_t, Merge> merges, TokenTable words, bool ignore_merges);

  // Appends the ids of one pre-token (raw bytes, not empty).
  void encode(const std::string& piece, std::vector<int64_t>& out) const;

  // The merging alone (no cache, no ignore_merges).
  void merge(std::string_view piece, std::vector<int32_t>& ids) const;
  // The symbols merging starts from.
  void first_symbols(std::string_view piece, std::vector<int32_t>& ids) const;

  std::size_t merge_count() const { return merges_.size(); }

  static constexpr std::size_t kCacheMaxPieceBytes = 256;  // as HF: longer pieces are rare
  static constexpr std::size_t kCacheMaxEntries = 200000;

 private:
  std::array<int32_t, 256> byte_ids_{};
  bool byte_level_ = true;
  CharSymbols chars_;
  std::unordered_map<uint64_t, Merge> merges_;
  TokenTable words_;
  bool ignore_merges_ = false;

  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace dflash::text
