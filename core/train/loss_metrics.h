// The loss's metrics as the host logs them, one definition for every loss.
//
// "accuracy" is a reserved per-row metric: the top-1 hit of the student's
// logits, argmax(h·Wᵀ) == target, [N] in {0, 1}. The host's slot accuracy,
// acc1 and simulated acceptance are built on it. A loss that reports it
// (every loss on the SDK's chunked-loss toolkit does) has it checked; for one
// that does not, the host computes it itself, chunk by chunk without
// gradient, and says once what that costs.
//
// Every metric a loss returns is logged under the plugin's name: a per-row
// [N] metric as its weighted mean over supervised rows (Σ w·x / Σ w, w the
// row weight), a 0-dim one as its mean over the step's micro-batches.
#pragma once

#include "dist/collective.h"
#include "plugin/instances.h"

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace dflash::train {

class LossMetrics {
 public:
  explicit LossMetrics(std::string plugin_name) : plugin_(std::move(plugin_name)) {}

  // The per-row top-1 hits [N] of one micro-batch (see above): the loss's
  // own on the host in fp64 (the copy the slot tally reads), else the
  // host's on the device. Throws naming the plugin when its "accuracy" is
  // not [N] of zeros and ones.
  at::Tensor top1_hits(const host::LossCall& call, const host::LossOutput& out);

  // Adds one micro-batch's metrics (on the device; nothing is read yet).
  void add(const host::LossCall& call, const host::LossOutput& out);

  // The step's figures as {plugin: {metric: value}}, read from the device in
  // one copy and, with `ranks`, summed over the ranks first (every rank
  // calls it); starts the next step.
  nlohmann::json take(dist::Collective* ranks = nullptr);

 private:
  struct Sum {
    at::Tensor numerator, denominator;  // 0-dim, fp64, on the device
  };
  std::string plugin_;
  std::map<std::string, Sum> sums_;
  bool warned_ = false;
};

}  // namespace dflash::train
