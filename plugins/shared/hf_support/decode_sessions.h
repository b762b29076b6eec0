// The KV caches of every decoding session, pooled: per layer one keys and one
// values tensor [rows, row_capacity, kv_heads, head_dim] (after q/k norm and
// RoPE), and each session owns one row. Pooling is what lets one decoding
// step attend over many sessions at once: consecutive rows are a view of the
// pool, other sets one gather, never one attention call per session.
//
// A new session takes the lowest free row. The pool grows (rows, or the row
// capacity when a session asks for more) by moving the valid part of every
// row into a larger allocation, and is released when the last session ends —
// unless it is kept (set_keep_when_empty: the decoder's CUDA graphs read the
// pool's addresses, so a pool that stays put keeps them valid from one
// sequence to the next). A kept pool that has to grow its row capacity grows
// it to a power of two, so sequences of varied lengths move it only a few
// times (its first capacity is the one asked for).
//
// generation() changes whenever the tensors move (grown, freed): whatever
// holds their addresses (a captured graph) is stale then.
//
// Growth is deferred: begin() only records the rows and capacity the pool
// must reach, and the first look at the pool after it (keys, values, rows,
// row_capacity, generation) makes them real in one move. Admitting a batch
// of N sessions one begin() at a time so costs one allocation of N rows,
// not N allocations of 1, 2, …, N rows (zero-filled and copied: quadratic in
// N, most of a CPU generate's time at batch 256).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <map>
#include <vector>

namespace dflash::hf {

class DecodeSessions {
 public:
  struct Session {
    int64_t row = 0;
    int64_t length = 0;    // cached tokens: rows [0, length) of its row are valid
    int64_t capacity = 0;  // the session's max_length
  };

  DecodeSessions() = default;  // no layers: for a member filled in later
  DecodeSessions(int64_t layers, int64_t kv_heads, int64_t head_dim, at::TensorOptions options);

  // A new, empty session for up to `capacity` tokens; returns its id.
  // Throws std::invalid_argument when capacity < 1.
  int64_t begin(int64_t capacity);
  // Frees the session's row; unknown ids are ignored.
  void end(int64_t id);
  // Throws std::invalid_argument naming the id when there is no such session.
  Session& at(int64_t id);
  // Rows of at least `row_capacity` tokens (a draft tree's nodes are stored
  // past its session's cached tokens, beyond what the session asked for);
  // the sessions' cached tokens keep their places.
  void reserve_row_capacity(int64_t row_capacity) {
    settle();
    if (row_capacity > row_capacity_ && !row_used_.empty()) grow(static_cast<int64_t>(row_used_.size()), row_capacity);
  }

  // A verified draft tree's accepted path kept in every layer: the tree's
  // nodes sit in session `id`'s row from `tree_start` on, node order; node
  // path[j] moves to tree_start + j (path increasing, parents first, as a
  // tree's nodes are stored). The length is left to the caller. On a CUDA
  // build's GPU one launch moves every layer's rows; elsewhere a gather
  // then a scatter per cache.
  void keep_path(int64_t id, int64_t tree_start, const std::vector<int64_t>& path);

  // [rows, row_capacity, kv_heads, head_dim] of layer `layer`.
  at::Tensor& keys(int64_t layer) {
    settle();
    return keys_[static_cast<size_t>(layer)];
  }
  at::Tensor& values(int64_t layer) {
    settle();
    return values_[static_cast<size_t>(layer)];
  }
  int64_t rows() const {
    settle();
    return static_cast<int64_t>(row_used_.size());
  }
  int64_t row_capacity() const {
    settle();
    return row_capacity_;
  }
  uint64_t generation() const {
    settle();
    return generation_;
  }
  // Whether every slot of the pool flattened to [rows · row_capacity, ...]
  // has an int32 offset (the decoding kernels' cu_k / seqused_k are int32).
  bool offsets_fit_int32() const {
    return rows() * row_capacity() < static_cast<int64_t>(std::numeric_limits<int32_t>::max());
  }
  // Keep the pool when its last session ends, and grow the row capacity, once
  // it has one, to powers of two (at most `capacity_limit` when that is > 0,
  // and never below what a session asks for).
  void set_keep_when_empty(bool keep, int64_t capacity_limit) {
    keep_when_empty_ = keep;
    capacity_limit_ = capacity_limit;
  }

 private:
  // Makes a growth begin() recorded real (const: the pool's size is
  // already decided; this only allocates and moves it).
  void settle() const {
    if (pending_rows_ > 0) const_cast<DecodeSessions*>(this)->grow(pending_rows_, pending_capacity_);
  }
  void grow(int64_t rows, int64_t row_capacity);

  int64_t layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  at::TensorOptions options_;
  std::vector<at::Tensor> keys_, values_;
  std::vector<bool> row_used_;
  int64_t row_capacity_ = 0;
  int64_t pending_rows_ = 0, pending_capacity_ = 0;  // a growth begin() recorded (0: none)
  uint64_t generation_ = 0;
  bool keep_when_empty_ = false;
  int64_t capacity_limit_ = 0;
  std::map<int64_t, Session> sessions_;
  int64_t next_id_ = 1;
};

}  // namespace dflash::hf
