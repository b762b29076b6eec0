// The training loop: data → target → drafter → loss → AdamW, with gradient
// accumulation and clipping, per-step metrics, a non-finite policy, atomic
// checkpoints and exact resume, on one process or on the ranks of a
// data-parallel run. Plugins are reached only through the Run (the C ABI).
//
// A step is five stages, named as the pipeline between target ranks and
// drafter ranks will split them:
//   produce  data → target forward → a hidden-state item
//   consume  drafter forward, loss, backward of one item
//   reduce   gradients summed across ranks (nothing on one process)
//   update   clipping, AdamW (a shard of it with train.shard_optimizer), LR
//   record   metrics, evaluation, checkpoint
#pragma once

#include "checkpoint/run_lock.h"
#include "dist/collective.h"
#include "memory/memory_plan.h"
#include "runtime/exit_codes.h"
#include "train/micro_batch_feed.h"
#include "train/run.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace dflash::train {

// What the command line adds to a run's config.
struct RunOptions {
  int64_t stop_after = 0;  // stop (with a checkpoint) after this many steps of this run; 0 = run to the end
  // The memory plan made before the plugins were created (memory/memory_plan.h):
  // its predicted peak goes to the metrics, and an out-of-memory report
  // compares it with what was allocated.
  std::optional<memory::DevicePlan> memory_plan;
  // The output directory's lock when the caller already holds it
  // (train/run_directory.h); rank 0 takes it otherwise.
  std::shared_ptr<checkpoint::RunLock> output_lock;
  // --resume-from: the step whose checkpoint to resume from instead of `latest`.
  std::optional<int64_t> resume_from;
  // --allow-config-change: resume although settings that shape the run changed.
  bool allow_config_change = false;
};

// The ranks a training rank works with.
struct TrainingRanks {
  dist::Collective& world;     // every rank of the run
  dist::Collective& trainers;  // the ranks that train a drafter replica: colocated, the world
  // Where this rank's micro-batches come from, made once the first step is
  // known; empty: its own data source and target (colocated).
  std::function<std::unique_ptr<MicroBatchFeed>(int64_t first_step)> feed;
};

// Resumes from <output_dir>/checkpoints/latest when present (checked: see
// checkpoint/checkpoint.h and train/resume.h). Returns the process exit
// code. Throws for errors that leave nothing to save. Each rank calls this
// with its own Run; the trainers' rank 0 writes metrics and checkpoints.
int run_training(Run& run, const RunOptions& options, const TrainingRanks& ranks);
int run_training(Run& run, const RunOptions& options, dist::Collective& group);  // colocated ranks
int run_training(Run& run, const RunOptions& options);                          // one process

// The drafter's parameter gradients from the run's first micro-batch at step
// 0 (the anchors of step 0, micro-batch 0), backpropagated once; nothing is
// updated or written. A/B comparisons check arms against each other with it.
host::NamedTensors first_step_gradients(Run& run);

}  // namespace dflash::train
