#include "train/phase_timer.h"

#include <torch/cuda.h>

namespace dflash::train {

void PhaseTimer::synchronize() const {
  if (device_.is_cuda()) torch::cuda::synchronize(device_.has_index() ? device_.index() : -1);
}

void PhaseTimer::start() {
  if (!enabled_) return;
  synchronize();
  last_ = std::chrono::steady_clock::now();
}

void PhaseTimer::end(const std::string& name) {
  if (!enabled_) return;
  synchronize();
  const auto now = std::chrono::steady_clock::now();
  phases_[name] = phases_.value(name, 0.0) + std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

nlohmann::json PhaseTimer::take() {
  nlohmann::json out = std::move(phases_);
  phases_ = nlohmann::json::object();
  start();
  return out;
}

}  // namespace dflash::train
