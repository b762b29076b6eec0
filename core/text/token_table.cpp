#include "text/token_table.h"

#include <algorithm>
#include <functional>

namespace dflash::text {
namespace {

constexpr std::size_t kMinSlots = 16;
constexpr uint64_t kEntryMask = 0xFFFFFFFFULL;

uint64_t tag_of(uint64_t hash) { return hash & ~kEntryMask; }

}  // namespace

uint64_t TokenTable::hash_of(std::string_view spelling) { return std::hash<std::string_view>{}(spelling); }

std::size_t TokenTable::slot_of(std::string_view spelling, uint64_t hash) const {
  const std::size_t mask = slots_.size() - 1;
  // The low bits pick the first slot, the high ones are the tag compared
  // before any spelling is: a probe seldom touches an entry that is not it.
  for (std::size_t slot = static_cast<std::size_t>(hash) & mask;; slot = (slot + 1) & mask) {
    const uint64_t word = slots_[slot];
    if (word == 0) return slot;
    if ((word & ~kEntryMask) == tag_of(hash) && entries_[(word & kEntryMask) - 1].spelling == spelling) return slot;
  }
}

void TokenTable::rebuild(std::size_t slots) {
  slots_.assign(slots, 0);
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const uint64_t hash = hash_of(entries_[i].spelling);
    slots_[slot_of(entries_[i].spelling, hash)] = tag_of(hash) | (i + 1);
  }
}

void TokenTable::reserve(std::size_t count) {
  entries_.reserve(count);
  std::size_t slots = kMinSlots;
  while (slots < 2 * count) slots *= 2;  // at most half full
  if (slots > slots_.size()) rebuild(slots);
}

bool TokenTable::insert(std::string& spelling, int32_t id) {
  if (2 * (entries_.size() + 1) > slots_.size()) rebuild(std::max(kMinSlots, 2 * slots_.size()));
  const uint64_t hash = hash_of(spelling);
  const std::size_t slot = slot_of(spelling, hash);
  if (slots_[slot] != 0) return false;
  entries_.push_back({std::move(spelling), id});
  slots_[slot] = tag_of(hash) | entries_.size();
  return true;
}

void TokenTable::assign(const std::string& spelling, int32_t id) {
  if (!slots_.empty()) {
    const uint64_t word = slots_[slot_of(spelling, hash_of(spelling))];
    if (word != 0) {
      entries_[(word & kEntryMask) - 1].id = id;
      return;
    }
  }
  std::string copy = spelling;
  insert(copy, id);
}

const int32_t* TokenTable::find(std::string_view spelling) const {
  if (slots_.empty()) return nullptr;
  const uint64_t word = slots_[slot_of(spelling, hash_of(spelling))];
  return word == 0 ? nullptr : &entries_[(word & kEntryMask) - 1].id;
}

}  // namespace dflash::text
