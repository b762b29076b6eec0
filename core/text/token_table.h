// Token spelling → id, for the vocabularies of 30k-260k tokens a tokenizer
// loads: entries in one array, found through an open-addressed index of
// (hash tag, entry) words. Loading looks a spelling up three times per merge
// (450k-1.5M lookups), where std::unordered_map's nodes cost a cache miss or
// two each and its growth relinks every node; here a lookup is one probe
// sequence in a flat array and one compare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dflash::text {

class TokenTable {
 public:
  struct Entry {
    std::string spelling;
    int32_t id = 0;
  };

  // Room for `count` spellings before the index grows.
  void reserve(std::size_t count);

  // Adds spelling → id, moving from `spelling`; false, leaving it as it is,
  // when the spelling is there already.
  bool insert(std::string& spelling, int32_t id);
  // Sets the id of `spelling`, adding it where it is missing.
  void assign(const std::string& spelling, int32_t id);

  // The id of `spelling`, or nullptr.
  const int32_t* find(std::string_view spelling) const;

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // In the order they were added. Adding moves them (a view of a spelling
  // taken before an insert may dangle).
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }

 private:
  static uint64_t hash_of(std::string_view spelling);
  // The index slot holding `spelling`, or the empty one where it would go.
  std::size_t slot_of(std::string_view spelling, uint64_t hash) const;
  void rebuild(std::size_t slots);

  std::vector<Entry> entries_;
  std::vector<uint64_t> slots_;  // (hash's high 32 bits << 32) | (entry + 1); 0 is empty
};

}  // namespace dflash::text
