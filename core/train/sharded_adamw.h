// ZeRO-1 (train.shard_optimizer): each rank keeps the AdamW states, and the
// fp32 masters under fp32_master, of its share of the parameters only, and
// updates that share; then every rank broadcasts its updated share, so all
// ranks hold the same whole parameters again. Gradients stay whole on every
// rank (they are all-reduced before): the global norm and clipping are as on
// one process, and so is the update, tensor for tensor.
//
// The share: whole tensors, largest first, each to the rank that holds the
// fewest elements so far (ties: the lowest rank), so a rank's optimizer
// memory is about 1/N of the whole. A checkpoint gets the whole state
// (gathered), so a run resumes at any world size and re-shards.
#pragma once

#include "dist/collective.h"
#include "train/adamw.h"

#include <memory>
#include <vector>

namespace dflash::train {

class ShardedAdamW final : public Optimizer {
 public:
  ShardedAdamW(host::NamedTensors parameters, const AdamWOptions& options, dist::Collective& group);

  void step(double lr, double grad_factor = 1.0) override;
  void zero_grad() override;
  host::NamedTensors state() override;  // a collective
  host::NamedTensors local_state() const override { return local_->state(); }
  void load_state(const host::NamedTensors& state) override { local_->load_state(state); }

  const char* last_kernel() const override { return local_->last_kernel(); }
  // Which rank updates parameter i (in the drafter's order).
  const std::vector<int>& owners() const { return owner_; }

 private:
  host::NamedTensors parameters_;
  AdamWOptions options_;
  dist::Collective& group_;
  std::vector<int> owner_;
  std::unique_ptr<AdamW> local_;
};

// The share (see above) of `numels` among `world_size` ranks.
std::vector<int> shard_by_size(const std::vector<int64_t>& numels, int world_size);

}  // namespace dflash::train
