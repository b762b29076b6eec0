// A target rank of a disaggregated run: reads every batch of each step in
// the data source's order (so its data position is the run's), runs the
// frozen target's forward on its own micro-batches (m mod T), and sends
// each item to its drafter rank (m mod D) once that rank has granted it a
// slot. It holds no drafter and no optimizer; it writes nothing. The time
// it waits for a slot is its stall, sent with every item for the drafter
// ranks' record.
#pragma once

#include "dist/collective.h"
#include "pipeline/topology.h"
#include "train/run.h"
#include "train/trainer.h"

namespace dflash::pipeline {

// Returns the exit code (0 when the drafter ranks ended the run). Throws
// dist::CollectiveError naming the drafter rank that failed or stopped
// responding.
int run_target_rank(train::Run& run, const train::RunOptions& options, dist::Collective& world, const Topology& topology);

}  // namespace dflash::pipeline
