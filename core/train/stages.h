// The stages of a step that both kinds of rank share: produce (the batch to
// the device, the target's forward: a hidden-state item) and the first half
// of consume (the drafter's forward and the loss). A colocated rank runs
// both; in a disaggregated run target ranks produce and drafter ranks
// consume (pipeline/).
#pragma once

#include "plugin/host_api.h"
#include "train/phase_timer.h"
#include "train/run.h"

#include <cstdint>
#include <string>

namespace dflash::train {

// One micro-batch as it passes through the stages. Everything it holds
// lives here, owned by the caller: an out-of-memory report can still name the
// batch and the features when the failure comes half-way.
struct MicroBatch {
  host::NamedTensors batch;              // as the data source made it (CPU)
  host::NamedTensors on_device, hidden;  // the batch on the device; the target's outputs (the hidden-state item)
  host::NamedTensors drafted;
  host::LossCall call;
  host::LossOutput out;
};

// produce: the batch to the device and the target's forward. `phase` says
// what runs (for errors); `timer` times it.
void produce(const Run& run, MicroBatch& mb, std::string& phase, PhaseTimer& timer);

// The anchors' seed of micro-batch `micro` (its index in the global batch)
// of `step`: the same blocks whatever the rank, on resume and in every A/B arm.
uint64_t sample_seed(uint64_t seed, int64_t step, int64_t micro);

// consume, first half: the drafter's forward and the loss on one item (not
// yet backpropagated). The features are dropped once read: the drafter keeps
// what its backward needs.
void draft_and_score(const Run& run, MicroBatch& mb, int64_t step, int64_t micro, std::string& phase, PhaseTimer& timer);

}  // namespace dflash::train
