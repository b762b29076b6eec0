#include "train/batch_lookahead.h"

#include <utility>

namespace dflash::train {

BatchLookahead::BatchLookahead(const host::DataSourceInstance& data, bool prefetch) : data_(data), prefetch_(prefetch) {}

BatchLookahead::~BatchLookahead() {
  if (in_flight_.valid()) in_flight_.wait();
}

BatchLookahead::Fetched BatchLookahead::fetch() const {
  Fetched f;
  f.position_before = data_.save_state();
  try {
    f.batch = data_.next_batch();
  } catch (...) {
    f.error = std::current_exception();
  }
  return f;
}

void BatchLookahead::settle() {
  if (in_flight_.valid()) ready_ = in_flight_.get();  // fetch() lets only save_state's errors out
}

std::optional<host::NamedTensors> BatchLookahead::next() {
  settle();
  Fetched f = ready_ ? std::move(*ready_) : fetch();
  ready_.reset();
  if (f.error) std::rethrow_exception(f.error);
  if (prefetch_ && f.batch) in_flight_ = std::async(std::launch::async, [this] { return fetch(); });
  return std::move(f.batch);
}

std::string BatchLookahead::position() {
  settle();
  return ready_ ? ready_->position_before : data_.save_state();
}

}  // namespace dflash::train
