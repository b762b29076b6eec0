// Where a training rank's micro-batches come from. Colocated, the rank
// reads every batch of the step from its own data source (passing over the
// other ranks') and runs its own target on its share; a disaggregated
// drafter rank receives its share as items from the target ranks
// (pipeline/drafter_feed.h). The trainer's step is the same over both.
#pragma once

#include "dist/collective.h"
#include "train/phase_timer.h"
#include "train/stages.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace dflash::train {

class MicroBatchFeed {
 public:
  enum class Got {
    kMine,    // mb.batch and mb.hidden are filled: train on it
    kOthers,  // another rank's micro-batch
    kEnded    // the data ended before this micro-batch
  };
  virtual ~MicroBatchFeed() = default;
  // Micro-batch `micro` of `step`, in order. `phase` and `timer` as for produce().
  virtual Got next(int64_t step, int64_t micro, MicroBatch& mb, std::string& phase, PhaseTimer& timer) = 0;
  // The micro-batch last filled is trained on: what it held may go.
  virtual void done() {}
  // The data position a checkpoint written after `step` records. Asked on
  // the training ranks' rank 0 only.
  virtual std::string position_after(int64_t step) = 0;
  // The step's figures of the feed for metrics.jsonl (null: none), gathered
  // over `trainers`: every training rank calls it once per step.
  virtual nlohmann::json step_figures(dist::Collective& trainers, int64_t step) {
    (void)trainers;
    (void)step;
    return nullptr;
  }
  // The run stops: nothing more is fetched.
  virtual void finish() {}
};

}  // namespace dflash::train
