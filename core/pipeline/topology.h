// Who does what in a disaggregated run (train.mode = disaggregated): world
// ranks [0, T) are target ranks, [T, T + D) drafter ranks. Micro-batch m of
// every step (its index in the global batch of train.grad_accumulation
// data-source batches) is produced by target rank m mod T and trained on by
// drafter rank m mod D: fixed by the step's layout alone, so a slow target
// never reorders the data, and a run resumes at any T and D with the same
// batches in the same places of each step.
#pragma once

#include "train/train_settings.h"

#include <cstdint>
#include <vector>

namespace dflash::pipeline {

enum class Role { kTarget, kDrafter };

// What travels from a target rank to a drafter rank in one message: a
// micro-batch's item, the data position at the end of a step (target rank 0
// to drafter rank 0: what a checkpoint records), or "no more: the data
// ended or the run is stopping".
struct Element {
  int64_t step = 0, micro = 0;  // micro -1: the step's end
  int source = 0;               // world rank of the target rank that sends it
  bool step_end() const { return micro < 0; }
};

class Topology {
 public:
  // Throws std::invalid_argument when the settings and the world do not add
  // up, saying which keys to change.
  Topology(const train::TrainSettings& settings, int world_size);

  int target_ranks() const { return targets_; }
  int drafter_ranks() const { return drafters_; }
  int64_t global_batch() const { return global_batch_; }
  Role role_of(int world_rank) const { return world_rank < targets_ ? Role::kTarget : Role::kDrafter; }
  int target_of(int64_t micro) const { return static_cast<int>(micro % targets_); }              // world rank
  int drafter_of(int64_t micro) const { return targets_ + static_cast<int>(micro % drafters_); }  // world rank
  // The drafter ranks' world ranks, in order (their group's members).
  std::vector<int> drafter_world_ranks() const;
  // The drafter ranks a target rank sends to, and the target ranks a drafter
  // rank receives from (world ranks, ascending): the pairs that talk.
  std::vector<int> drafters_fed_by(int target_rank) const;
  std::vector<int> targets_feeding(int drafter_rank) const;
  // What drafter rank `drafter_rank` receives during `step`, in order: its
  // micro-batches, then (drafter rank T only) the step's end from target 0.
  std::vector<Element> drafter_sequence(int drafter_rank, int64_t step) const;

 private:
  int targets_, drafters_;
  int64_t global_batch_;
};

// "target rank 1 (rank 1)", "drafter rank 0 (rank 3)": how errors and logs name a rank.
std::string describe_rank(const Topology& topology, int world_rank);

}  // namespace dflash::pipeline
