#include "decode_sessions.h"

#include <host_upload.h>
#include <kernel_ops.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dflash::hf {

DecodeSessions::DecodeSessions(int64_t layers, int64_t kv_heads, int64_t head_dim, at::TensorOptions options)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), options_(options) {}

int64_t DecodeSessions::begin(int64_t capacity) {
  if (capacity < 1) throw std::invalid_argument("a decoding session needs room for at least one token");
  auto free_row = std::find(row_used_.begin(), row_used_.end(), false);
  const int64_t row = free_row - row_used_.begin();
  // The size the pool must reach: what it has or a growth already recorded.
  const int64_t have_capacity = std::max(row_capacity_, pending_capacity_);
  if (free_row == row_used_.end() || capacity > have_capacity) {
    int64_t row_capacity = std::max(have_capacity, capacity);
    // A kept pool that must hold longer sequences than before (a run of
    // varied lengths, one after another) grows to a power of two, so it moves
    // a few times, not at every new longest sequence. Its first size is what
    // was asked: a batch of equal capacities (generate) never rounds up.
    if (keep_when_empty_ && capacity > row_capacity_ && row_capacity_ > 0) {
      int64_t rounded = 1;
      while (rounded < capacity) rounded *= 2;
      if (capacity_limit_ > 0) rounded = std::min(rounded, std::max(capacity_limit_, capacity));
      row_capacity = std::max(row_capacity, rounded);
    }
    pending_rows_ = std::max(static_cast<int64_t>(row_used_.size()), row + 1);
    pending_capacity_ = row_capacity;
    if (free_row == row_used_.end()) row_used_.push_back(false);
  }
  row_used_[static_cast<size_t>(row)] = true;
  sessions_.emplace(next_id_, Session{row, 0, capacity});
  return next_id_++;
}

void DecodeSessions::end(int64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  row_used_[static_cast<size_t>(it->second.row)] = false;
  sessions_.erase(it);
  if (sessions_.empty() && !keep_when_empty_) {  // nothing to keep: give the memory back
    ++generation_;
    keys_.clear();
    values_.clear();
    row_used_.clear();
    row_capacity_ = 0;
    pending_rows_ = pending_capacity_ = 0;
  }
}

DecodeSessions::Session& DecodeSessions::at(int64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end())
    throw std::invalid_argument("no decoding session " + std::to_string(id) + " (ended, or never begun)");
  return it->second;
}

void DecodeSessions::grow(int64_t rows, int64_t row_capacity) {
  // Only the cached prefix of the old rows is moved: while a batch is being
  // admitted the new rows are empty, so growing then copies nothing.
  int64_t valid = 0;
  for (const auto& [id, s] : sessions_) valid = std::max(valid, s.length);
  pending_rows_ = pending_capacity_ = 0;  // this is the growth recorded
  const int64_t old_rows = keys_.empty() ? 0 : keys_.front().size(0);
  for (int64_t layer = 0; layer < layers_; ++layer) {
    for (auto* pool : {&keys_, &values_}) {
      // Zero-filled: a batched step reads every session's row up to the
      // longest one, masking the positions past its own length. A masked
      // position weighs 0, but 0 · NaN is NaN, and fresh memory may hold NaN
      // bit patterns; zeros (and later stale, but finite, keys) are safe.
      at::Tensor grown = at::zeros({rows, row_capacity, kv_heads_, head_dim_}, options_);
      if (layer < static_cast<int64_t>(pool->size())) {
        if (valid > 0) grown.narrow(0, 0, old_rows).narrow(1, 0, valid).copy_((*pool)[layer].narrow(1, 0, valid));
        (*pool)[layer] = grown;  // the old allocation is freed here, layer by layer
      } else {
        pool->push_back(grown);
      }
    }
  }
  row_used_.resize(static_cast<size_t>(rows), false);
  row_capacity_ = row_capacity;
  ++generation_;
}

void DecodeSessions::keep_path(int64_t id, int64_t tree_start, const std::vector<int64_t>& path) {
  const Session& s = at(id);
  const auto m = static_cast<int64_t>(path.size());
  bool in_place = true;  // a path 0, 1, …, m − 1 already sits where it is kept
  for (int64_t j = 0; j < m; ++j) in_place &= path[static_cast<size_t>(j)] == j;
  if (in_place || layers_ == 0) return;
  settle();
  const int64_t base = s.row * row_capacity_ + tree_start;
  std::vector<int64_t> from;
  for (int64_t j = 0; j < m; ++j) from.push_back(base + path[static_cast<size_t>(j)]);
  const auto device = keys_.front().device();
  if (device.is_cuda() && kernel_ops::available()) {
    std::vector<at::Tensor> caches;
    for (size_t layer = 0; layer < keys_.size(); ++layer) {
      caches.push_back(keys_[layer]);
      caches.push_back(values_[layer]);
    }
    kernel_ops::move_cache_rows_(caches, kv_heads_ * head_dim_, from, base);
    return;
  }
  std::vector<int64_t> to;  // the gather-then-scatter of the other devices: rows base, base + 1, …
  for (int64_t j = 0; j < m; ++j) to.push_back(base + j);
  const at::Tensor source = decode_support::upload(from, device), target = decode_support::upload(to, device);
  for (size_t layer = 0; layer < keys_.size(); ++layer)
    for (at::Tensor* cache : {&keys_[layer], &values_[layer]}) {
      const at::Tensor flat = cache->view({-1, kv_heads_, head_dim_});
      flat.index_copy_(0, target, flat.index_select(0, source));  // gathered first: sources and targets may overlap
    }
}

}  // namespace dflash::hf
