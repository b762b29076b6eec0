// Where a training step's time goes, when asked (train.profile_phases): the
// device is synchronised at each phase boundary so that a phase's time is its
// own work and not the queue it inherited. That slows the step, so it is off
// by default; metrics.jsonl then gets "phase_seconds" {phase: seconds}.
#pragma once

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

namespace dflash::train {

class PhaseTimer {
 public:
  PhaseTimer(bool enabled, c10::Device device) : enabled_(enabled), device_(device) {}
  bool enabled() const { return enabled_; }
  // Starts the step's clock.
  void start();
  // Ends the phase in progress, adding its time under `name` (phases that
  // repeat, e.g. per micro-batch, add up).
  void end(const std::string& name);
  // The step's phases so far, and a fresh start.
  nlohmann::json take();

 private:
  void synchronize() const;
  bool enabled_;
  c10::Device device_;
  std::chrono::steady_clock::time_point last_;
  nlohmann::json phases_ = nlohmann::json::object();
};

}  // namespace dflash::train
