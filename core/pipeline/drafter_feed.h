// A drafter rank's micro-batches: the items its inbox receives from the
// target ranks (pipeline/drafter_inbox.h), and the pipeline's figures for
// metrics.jsonl — per role, tokens/s produced and consumed, the queue's
// occupancy, the target ranks' stall (waiting for a slot) and the drafter
// ranks' (waiting for data) as fractions of wall time, each rank's peak
// memory — with a line saying which side bounds the run and what to try.
#pragma once

#include "pipeline/topology.h"
#include "train/micro_batch_feed.h"

#include <memory>

namespace dflash::pipeline {

class DrafterInbox;

// `world`: every rank; `first_step`: where this run starts.
std::unique_ptr<train::MicroBatchFeed> make_drafter_feed(dist::Collective& world, const Topology& topology,
                                                         const train::TrainSettings& settings, int64_t first_step);

// The console's verdict from an interval's stall fractions: which side
// bounds the pipeline and what to try, e.g. "target-bound: drafter ranks
// waited 61 % of the time for data — more target ranks (try --target-ranks
// 3 --drafter-ranks 1) …". `bound` gets "target", "drafter" or "balanced".
std::string pipeline_advice(const Topology& topology, double target_stall, double drafter_stall, std::string& bound);

}  // namespace dflash::pipeline
