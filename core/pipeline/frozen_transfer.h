// The start of a disaggregated run: drafter ranks never load the target.
// Target rank 0 sends its description and its frozen weights (embed_tokens,
// lm_head, final_norm) to every drafter rank, which places them on its own
// device; the drafter ranks' export_config (their facts: block size, target
// layers) goes back to every target rank.
#pragma once

#include "dist/collective.h"
#include "pipeline/topology.h"
#include "train/run.h"

namespace dflash::pipeline {

// Called by every rank of the world, in the same order. On target ranks
// `run` holds the target (and data); on drafter ranks the drafter, loss and
// scheduler. Afterwards every rank's run is bound: drafter ranks to the
// remote target, target ranks to the drafter's facts. Throws
// std::invalid_argument when target rank 0's frozen weights are not on its
// own device (the seed's verifier weights left on another GPU).
void exchange_at_start(train::Run& run, dist::Collective& world, const Topology& topology);

}  // namespace dflash::pipeline
