#include "train/train_schema.h"

#include <dflash/sdk/schema.hpp>

namespace dflash::train {
namespace {

constexpr double kMaxEvalTokens = 1 << 20;
// Upper bounds far above any real run and below where the arithmetic that
// uses them overflows (a timeout in ms as int64, an lr as float): a value
// past them is a typo or an attack, refused naming its key.
constexpr double kMaxSteps = 1e9;           // optimizer steps, and step intervals
constexpr double kMaxCount = 1 << 20;       // prompts, batches, checkpoints, items
constexpr double kMaxRanks = 1 << 16;
constexpr double kMaxTimeoutS = 7 * 86400;  // a week
constexpr double kMaxSeed = 9007199254740992.0;  // 2^53: exact in every JSON reader

}  // namespace

const nlohmann::json& train_schema() {
  using sdk::Bounds;
  static const nlohmann::json schema =
      sdk::Schema()
          .integer("seed", 0, "seed for every random choice of the run (data order, init, the drafter's sampling)", Bounds::between(0, kMaxSeed))
          .device("device", "cpu", "where the target and the drafter run: cpu, cuda or cuda:N")
          .string("dtype", "float32", "compute dtype of the target and the drafter", {"float32", "bfloat16", "float16"})
          .integer("steps", 1000, "optimizer steps of the run", Bounds::between(1, kMaxSteps))
          .number("lr", 6e-4, "peak learning rate handed to the scheduler", Bounds::above(0).up_to(10))
          .string("output_dir", "runs/default", "where checkpoints and metrics.jsonl are written")
          .integer("grad_accumulation", 1,
                   "data-source batches per optimizer step, over all ranks together: the global batch, the same "
                   "whatever the world size (each rank takes every world-size-th batch; docs/distributed.md)",
                   Bounds::between(1, kMaxCount))
          .number("grad_clip", 1.0, "clip the global gradient norm to this (0 = no clipping)", Bounds::between(0, 1e6))
          .number("weight_decay", 0.0, "AdamW's decoupled weight decay", Bounds::between(0, 10))
          .number("adam_beta1", 0.9, "AdamW β1", Bounds::between(0, 1))
          .number("adam_beta2", 0.999, "AdamW β2", Bounds::between(0, 1))
          .number("adam_eps", 1e-8, "AdamW ε", Bounds::above(0).up_to(1))
          .string("precision", "same",
                  "same: weights, gradients and AdamW states in dtype; fp32_master: fp32 master weights and states",
                  {"same", "fp32_master"})
          .string("mode", "colocated",
                  "how ranks share the work: colocated = every rank holds the target and a drafter replica and "
                  "trains on its share of each global batch (one process: the same, alone); disaggregated = "
                  "train.topology's target ranks run the target and send hidden-state items to its drafter ranks, "
                  "which train (docs/distributed.md)",
                  {"colocated", "disaggregated"})
          .object("topology",
                  sdk::Schema()
                      .integer("target_ranks", 1, "ranks 0…T−1: the frozen target only", Bounds::between(1, kMaxRanks))
                      .integer("drafter_ranks", 1, "ranks T…T+D−1: a drafter replica each, data-parallel among themselves",
                               Bounds::between(1, kMaxRanks)),
                  "with mode = disaggregated: how the world splits into target ranks and drafter ranks (T + D = the "
                  "world size); the console's pipeline line says which side bounds the run")
          .integer("queue_depth", 2,
                   "with mode = disaggregated: hidden-state items a drafter rank holds at most (received, not yet "
                   "trained on); target ranks send only against the free slots it grants, so its memory for items is "
                   "queue_depth × the item size whatever the number of target ranks",
                   Bounds::between(1, 1024))
          .memory_knob("queue depth")
          .boolean("shard_optimizer", false,
                   "ZeRO-1 with several ranks: each rank keeps the AdamW states (and fp32 masters) of 1/N of the "
                   "parameters, updates that slice, and the ranks all-gather the updated parameters")
          .number("collective_timeout_s", 600,
                  "with several ranks: a collective (start-up, gradient reduction, checkpoint) that waits longer than "
                  "this for a rank stops the run with an error naming that rank (1 s to a week)",
                  Bounds::between(1, kMaxTimeoutS))
          .string("teacher", "hidden",
                  "what the loss gets from the target: hidden = its last hidden states (for KL through the lm_head); "
                  "none = hard labels only",
                  {"hidden", "none"})
          .string("on_nonfinite", "skip",
                  "a NaN/Inf loss or gradient: skip = drop that step's update (counted; stops after max_nonfinite in a "
                  "row); stop = stop at once, keeping the last good checkpoint",
                  {"skip", "stop"})
          .integer("max_nonfinite", 5, "consecutive skipped steps before the run stops", Bounds::between(1, kMaxCount))
          .integer("checkpoint_every", 0, "steps between checkpoints (0 = only at the end)", Bounds::between(0, kMaxSteps))
          .integer("keep_checkpoints", 2, "newest checkpoints kept on disk", Bounds::between(1, kMaxCount))
          .string("progress", "auto", "console: a progress bar on a terminal, plain lines otherwise", {"auto", "bar", "lines"})
          .integer("log_every", 1, "steps between console lines (metrics.jsonl gets every step)", Bounds::between(1, kMaxSteps))
          .boolean("tensorboard", true,
                   "TensorBoard event file (events.out.tfevents.*) beside metrics.jsonl in output_dir, every step's "
                   "numbers as scalars under their metrics.jsonl names; written by rank 0 (docs/metrics.md)")
          .integer("eval_every", 0,
                   "steps between speculative-decoding evaluations on eval_prompts (0 = none); the mean acceptance "
                   "length goes to metrics.jsonl as eval_tau",
                   Bounds::between(0, kMaxSteps))
          .string("eval_prompts", "", "held-out prompts for eval_every: JSON lines as `dflash-host eval --prompts` reads")
          .integer("eval_max_prompts", 8, "prompts used per evaluation", Bounds::between(1, kMaxCount))
          // Token counts are capped far above any context (prompt + new
          // tokens is computed in int64, and a cache is sized from it).
          .integer("eval_max_new_tokens", 64, "tokens generated per prompt per evaluation",
                   Bounds::between(1, kMaxEvalTokens))
          .integer("eval_prompt_tokens", 64, "tokens of an input_ids line used as its prompt",
                   Bounds::between(1, kMaxEvalTokens))
          .integer("eval_tree_nodes", 0,
                   "beside each periodic evaluation's chain τ, one with DDTree draft trees of this many nodes "
                   "(`dflash-host eval --verify tree`); its τ goes to metrics.jsonl as eval_tree_tau (0 = none)",
                   Bounds::between(0, kMaxEvalTokens))
          .number("eval_tree_temperature", 1.0,
                  "the temperature of eval_tree_nodes' trees (`dflash-host eval --tree-temperature`): below 1 "
                  "sharpens the drafter's distributions before the tree is chosen; 1 is DDTree's own rule",
                  Bounds::above(0).up_to(100))
          .boolean("prefetch", true,
                   "fetch the next batch on a worker thread while the step runs (the data source is still called "
                   "one call at a time, in the same order; the training is bitwise the same); false: between steps")
          .boolean("profile_phases", false,
                   "synchronize the device at each phase of a step (data, target, drafter, loss, backward, "
                   "optimizer, metrics) and log their times as phase_seconds in metrics.jsonl; slows the step")
          .number("memory_slack", 0.05,
                  "the memory planner's allowance for allocator fragmentation, as a fraction of the predicted peak",
                  Bounds::between(0, 1))
          .json();
  return schema;
}

}  // namespace dflash::train
