#include "pipeline/topology.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace dflash::pipeline {

Topology::Topology(const train::TrainSettings& s, int world_size)
    : targets_(s.target_ranks), drafters_(s.drafter_ranks), global_batch_(s.grad_accumulation) {
  const std::string split = std::to_string(targets_) + " target + " + std::to_string(drafters_) + " drafter ranks";
  if (targets_ < 1 || drafters_ < 1)
    throw std::invalid_argument("train.topology: " + split + "; a disaggregated run needs at least one of each");
  if (targets_ + drafters_ != world_size)
    throw std::invalid_argument("train.topology is " + split + " = " + std::to_string(targets_ + drafters_) +
                                " ranks, but this run has " + std::to_string(world_size) +
                                " (WORLD_SIZE): launch T + D ranks (`dflash-host launch --nproc-per-node " +
                                std::to_string(targets_ + drafters_) + "`), or set --target-ranks and --drafter-ranks "
                                "(train.topology) to add up to " + std::to_string(world_size));
  if (global_batch_ < std::max(targets_, drafters_))
    throw std::invalid_argument("train.grad_accumulation is " + std::to_string(global_batch_) +
                                " data-source batches per step, fewer than the " +
                                std::to_string(std::max(targets_, drafters_)) + " " +
                                (targets_ >= drafters_ ? "target" : "drafter") + " ranks of train.topology (" + split +
                                "): micro-batch m of a step goes to target rank m mod T and drafter rank m mod D, so "
                                "some rank would have nothing to do. Set train.grad_accumulation to at least " +
                                std::to_string(std::max(targets_, drafters_)) +
                                " (a common multiple of T and D keeps every rank equally busy)");
  if (s.eval_every > 0)
    throw std::invalid_argument("train.eval_every is " + std::to_string(s.eval_every) +
                                ", but with train.mode = disaggregated no rank holds both the target and the drafter "
                                "that speculative decoding needs: set train.eval_every to 0 and run `dflash-host eval` "
                                "on a checkpoint");
}

std::vector<int> Topology::drafter_world_ranks() const {
  std::vector<int> out;
  for (int d = 0; d < drafters_; ++d) out.push_back(targets_ + d);
  return out;
}

std::vector<int> Topology::drafters_fed_by(int target_rank) const {
  std::set<int> out;
  for (int64_t m = target_rank; m < global_batch_; m += targets_) out.insert(drafter_of(m));
  if (target_rank == 0) out.insert(targets_);  // the step's end
  return {out.begin(), out.end()};
}

std::vector<int> Topology::targets_feeding(int drafter_rank) const {
  std::set<int> out;
  for (int64_t m = drafter_rank - targets_; m < global_batch_; m += drafters_) out.insert(target_of(m));
  if (drafter_rank == targets_) out.insert(0);
  return {out.begin(), out.end()};
}

std::vector<Element> Topology::drafter_sequence(int drafter_rank, int64_t step) const {
  std::vector<Element> out;
  for (int64_t m = drafter_rank - targets_; m < global_batch_; m += drafters_) out.push_back({step, m, target_of(m)});
  if (drafter_rank == targets_) out.push_back({step, -1, 0});
  return out;
}

std::string describe_rank(const Topology& topology, int world_rank) {
  return topology.role_of(world_rank) == Role::kTarget
             ? "target rank " + std::to_string(world_rank) + " (rank " + std::to_string(world_rank) + ")"
             : "drafter rank " + std::to_string(world_rank - topology.target_ranks()) + " (rank " +
                   std::to_string(world_rank) + ")";
}

}  // namespace dflash::pipeline
