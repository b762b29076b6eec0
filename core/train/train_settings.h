// The host's "train" section as a typed struct, parsed once from the
// resolved config (validated against train_schema(), every default filled
// in there). Nothing else reads the section by key: train, eval, ab, plan
// and the trainer all take a TrainSettings. The defaults live in one place,
// the schema (train/train_schema.cpp); this file has none of its own.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace dflash::train {

enum class Precision { kSame, kFp32Master };
enum class Teacher { kHidden, kNone };
enum class OnNonfinite { kSkip, kStop };
// What each rank does: colocated = the target and a drafter replica on every
// rank; disaggregated = target ranks send hidden-state items to drafter
// ranks (pipeline/).
enum class Mode { kColocated, kDisaggregated };

struct TrainSettings {
  // What the run computes.
  uint64_t seed = 0;
  std::string device;  // "cpu", "cuda", "cuda:N"
  std::string dtype;   // "float32", "bfloat16", "float16"
  int64_t steps = 0;
  double lr = 0;
  // Data-source batches per optimizer step, over all ranks together: the
  // global batch, the same whatever the world size (docs/distributed.md).
  int64_t grad_accumulation = 0;
  double grad_clip = 0, weight_decay = 0, adam_beta1 = 0, adam_beta2 = 0, adam_eps = 0;
  Precision precision = Precision::kSame;
  Teacher teacher = Teacher::kHidden;
  Mode mode = Mode::kColocated;
  bool shard_optimizer = false;  // ZeRO-1: each rank keeps the AdamW states of 1/N of the parameters
  // mode = disaggregated: ranks [0, target_ranks) run the target, the next
  // drafter_ranks train; each drafter rank holds at most queue_depth items
  // (a memory knob: plan proposes the deepest queue that fits).
  int target_ranks = 1, drafter_ranks = 1;
  int64_t queue_depth = 0;

  // Faults and checkpoints.
  OnNonfinite on_nonfinite = OnNonfinite::kSkip;
  int64_t max_nonfinite = 0;
  int64_t checkpoint_every = 0, keep_checkpoints = 0;
  double collective_timeout_s = 0;  // a collective that waits longer names the rank missing and stops the run

  // Where results go and how they are shown.
  std::string output_dir;
  std::string progress;  // auto, bar, lines
  int64_t log_every = 0;
  bool tensorboard = false;  // an event file beside metrics.jsonl (rank 0)
  bool prefetch = false, profile_phases = false;

  // Periodic evaluation.
  int64_t eval_every = 0;
  std::string eval_prompts;
  int64_t eval_max_prompts = 0, eval_max_new_tokens = 0, eval_prompt_tokens = 0;
  int64_t eval_tree_nodes = 0;  // > 0: a second evaluation with draft trees of this many nodes
  double eval_tree_temperature = 1.0;  // those trees' temperature (eval::Verification::tree_temperature)

  // The memory planner's allowance for fragmentation.
  double memory_slack = 0;

  bool fp32_master() const { return precision == Precision::kFp32Master; }
  bool wants_teacher() const { return teacher == Teacher::kHidden; }
  bool disaggregated() const { return mode == Mode::kDisaggregated; }
};

// `train`: the resolved section (every key the schema has is present).
// Throws std::invalid_argument naming the key when one is missing or of
// the wrong type, which only a caller that bypassed resolve_config sees.
TrainSettings parse_train_settings(const nlohmann::json& train);

}  // namespace dflash::train
