#pragma once
// The linear-attention layers' decoding state of every session, pooled: a
// decoding step over many sessions gathers their conv windows and recurrent
// states with one index_select a layer and stores the new ones with one
// index_copy_, where stacking and cloning them one session at a time cost
// a dozen small operations per session and layer (and dominated generate's
// steps at batch 256).
//
// Each session holds a slot of two buffers. A step reads the slot's current
// buffer and writes the other, then flips which is current; the state before
// the step stays in the buffer just left, so truncate can go back to it (or
// replay from it) without a copy taken at every step.
//
// Every layer's buffers live in one tensor, layers first, so a cut replays
// all layers in one call (the recurrent rule takes them as its rows).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dflash::target {

class LinearStatePool {
 public:
  LinearStatePool() = default;
  // `layers` linear layers; each buffer holds a window of `window_shape`
  // (in window_options) and a state of `state_shape` (in state_options).
  LinearStatePool(int64_t layers, std::vector<int64_t> window_shape, std::vector<int64_t> state_shape,
                  at::TensorOptions window_options, at::TensorOptions state_options);

  // A free slot (the pool grows by doubling when none is), its current
  // buffer zeroed: an empty window and state.
  int64_t acquire();
  void release(int64_t slot);

  // The row of slot's current buffer (current = true) or other buffer in
  // windows(layer) and states(layer).
  int64_t buffer(int64_t slot, bool current) const { return 2 * slot + (parity_[static_cast<size_t>(slot)] ^ (current ? 0 : 1)); }
  // (A slot's two buffers are rows 2s and 2s + 1: the other one is row ^ 1.)
  // Makes the other buffer current (after a step wrote it, or to go back).
  void flip(int64_t slot) { parity_[static_cast<size_t>(slot)] ^= 1; }

  // One layer's buffers, views: [2 · capacity, window_shape...] and
  // [2 · capacity, state_shape...].
  at::Tensor windows(size_t layer) const { return windows_.select(0, static_cast<int64_t>(layer)); }
  at::Tensor states(size_t layer) const { return states_.select(0, static_cast<int64_t>(layer)); }
  // Every layer's: [layers, 2 · capacity, ...].
  const at::Tensor& all_windows() const { return windows_; }
  const at::Tensor& all_states() const { return states_; }
  // Bumped whenever the buffers move (the pool grows): what read their
  // addresses (a captured CUDA graph) is stale then.
  uint64_t generation() const { return generation_; }

 private:
  void grow();

  int64_t layers_ = 0;
  std::vector<int64_t> window_shape_, state_shape_;
  at::TensorOptions window_options_, state_options_;
  at::Tensor windows_, states_;
  uint64_t generation_ = 0;
  std::vector<uint8_t> parity_;
  std::vector<bool> used_;
};

}  // namespace dflash::target
