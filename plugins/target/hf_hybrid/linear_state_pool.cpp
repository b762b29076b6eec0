#include "linear_state_pool.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dflash::target {

namespace {

std::vector<int64_t> with_rows(int64_t layers, int64_t rows, const std::vector<int64_t>& shape) {
  std::vector<int64_t> sizes{layers, rows};
  sizes.insert(sizes.end(), shape.begin(), shape.end());
  return sizes;
}

}  // namespace

LinearStatePool::LinearStatePool(int64_t layers, std::vector<int64_t> window_shape, std::vector<int64_t> state_shape,
                                 at::TensorOptions window_options, at::TensorOptions state_options)
    : layers_(layers),
      window_shape_(std::move(window_shape)),
      state_shape_(std::move(state_shape)),
      window_options_(window_options),
      state_options_(state_options) {}

void LinearStatePool::grow() {
  const int64_t old_slots = static_cast<int64_t>(used_.size());
  const int64_t slots = std::max<int64_t>(1, 2 * old_slots);
  // Slot s's buffers are rows 2s and 2s + 1, so the old rows keep their
  // places as the prefix of the new tensors.
  at::Tensor windows = at::empty(with_rows(layers_, 2 * slots, window_shape_), window_options_);
  at::Tensor states = at::empty(with_rows(layers_, 2 * slots, state_shape_), state_options_);
  if (old_slots > 0) {
    windows.narrow(1, 0, 2 * old_slots).copy_(windows_);
    states.narrow(1, 0, 2 * old_slots).copy_(states_);
  }
  windows_ = std::move(windows);
  states_ = std::move(states);
  ++generation_;
  used_.resize(static_cast<size_t>(slots), false);
  parity_.resize(static_cast<size_t>(slots), 0);
}

int64_t LinearStatePool::acquire() {
  auto free = std::find(used_.begin(), used_.end(), false);
  if (free == used_.end()) {
    const size_t old = used_.size();
    grow();
    free = used_.begin() + static_cast<std::ptrdiff_t>(old);
  }
  *free = true;
  const int64_t slot = free - used_.begin();
  parity_[static_cast<size_t>(slot)] = 0;
  if (layers_ > 0) {
    windows_.select(1, buffer(slot, true)).zero_();
    states_.select(1, buffer(slot, true)).zero_();
  }
  return slot;
}

void LinearStatePool::release(int64_t slot) {
  if (slot < 0 || slot >= static_cast<int64_t>(used_.size()))
    throw std::out_of_range("LinearStatePool: no slot " + std::to_string(slot));
  used_[static_cast<size_t>(slot)] = false;
}


}  // namespace dflash::target
