// The memory planner: what a training run will hold on its device, by
// category and by phase of the step, predicted before anything is allocated
// (`dflash-host plan`, and the check before `train`). The plugins answer for
// their own parts through plan_memory / estimate_memory (ABI 1.2); the host
// adds what it owns: the frozen verifier weights, gradients, AdamW states,
// the batch and the hidden-state items in flight. docs/memory.md has the
// phase model and the GPU measurements that check it.
#pragma once

#include "plugin/instances.h"
#include "plugin/registry.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflash::memory {

// The phases of one step on the device; a line is alive in some of them.
enum PhaseBit : unsigned {
  kTargetForward = 1,  // the target's forward: the batch, its outputs, its working memory
  kLossForward = 2,    // drafter forward + loss: the features still held, activations, the loss's working memory
  kBackward = 4,       // drafter backward at its peak
  kOptimizer = 8,      // clipping and AdamW
  kEveryPhase = 15,
};
const char* phase_name(unsigned bit);

// Which rank a plan is for. A disaggregated run (train.mode =
// disaggregated) has two kinds: a target rank holds the target, its batch
// and the item it is about to send; a drafter rank holds the frozen
// verifier weights it received, the drafter, its optimizer (sharded over
// the drafter ranks with shard_optimizer), train.queue_depth items and the
// step.
enum class PlanRole { kColocated, kTargetRank, kDrafterRank };
const char* role_name(PlanRole role);  // "target and drafter", "target rank", "drafter rank"

struct PlanLine {
  std::string category;
  std::string source;  // "host", or the plugin ("drafter dflash")
  int64_t bytes = 0;
  unsigned phases = kEveryPhase;
  std::string note;    // e.g. "shared with the target weights"
};

// A byte count the plan cannot represent: a figure beyond int64 (settings far
// beyond any device, e.g. tokens_per_batch = 2^63 − 1) saturates here, and
// the plan lists it in `overflowed` rather than print a wrapped figure.
constexpr int64_t kTooManyBytes = INT64_MAX;

struct DevicePlan {
  std::string device, dtype;
  int64_t world_size = 1;  // the plan is one rank's of this many (a drafter rank's: of the drafter ranks)
  PlanRole role = PlanRole::kColocated;
  int64_t item_bytes = 0;  // one hidden-state item on the device: the target's outputs for one batch
  std::vector<PlanLine> lines;
  int64_t phase_bytes[4] = {0, 0, 0, 0};  // by phase, in PhaseBit order
  int64_t peak_bytes = 0;                 // the largest phase: the allocator's predicted peak
  unsigned peak_phase = kLossForward;
  double slack_fraction = 0;
  int64_t slack_bytes = 0;  // allocator fragmentation allowance
  int64_t total_bytes = 0;  // peak + slack: what must fit
  std::vector<std::string> missing;  // plugins that did not estimate their part
  std::vector<std::string> overflowed;  // lines (or totals) whose bytes exceed int64: saturated at kTooManyBytes
  nlohmann::json facts = nlohmann::json::object();  // batch shape, block tokens, loss rows…

  bool complete() const { return missing.empty(); }
  bool representable() const { return overflowed.empty(); }
  // The bytes of the lines whose category starts with `prefix` (tests, reports).
  int64_t bytes_of(const std::string& prefix) const;
};

// What the arithmetic needs, as the plugins reported it (tests build it by hand).
struct PlanInputs {
  std::string device = "cpu", dtype = "float32";
  bool fp32_master = false;
  bool fused_adamw = false;  // ATen's fused AdamW will run (CUDA, LibTorch ≥ 2.1)
  int64_t grad_accumulation = 1;  // the global batch, in data-source batches
  int64_t world_size = 1;         // ranks of a data-parallel run: the plan is one rank's
  bool shard_optimizer = false;
  bool teacher = false;
  PlanRole role = PlanRole::kColocated;
  int64_t queue_depth = 0;  // a drafter rank's items at most: train.queue_depth (plan_for fills it; no default here)
  int64_t gemm_workspace_bytes = 0;  // cuBLAS's per stream (memory::gemm_workspace_bytes); 0 off CUDA
  double slack_fraction = 0.05;
  std::string data_label = "data", target_label = "target", drafter_label = "drafter", loss_label = "loss";
  host::PluginMemoryPlan data, target, drafter;
  std::optional<host::LossMemoryEstimate> loss;
};
DevicePlan compute_plan(const PlanInputs& in);

// What the run's planner (train/run_plan.h, which asks the plugins) shares
// with compute_plan: a dtype name's element size, a byte count rounded and
// saturated at kTooManyBytes, and a plugin's integer fact (saturated; the
// fallback where it is absent or not a number).
int64_t element_bytes(const std::string& dtype);
int64_t as_bytes(double v);
int64_t fact(const nlohmann::json& facts, const char* key, int64_t fallback = 0);

// A loss planned alone (train::plan_loss_alone), for `plan --loss NAME --rows N --vocab V`.
struct LossAlonePlan {
  std::string loss_label, device, dtype;
  int64_t rows = 0, vocab = 0, hidden = 0;
  bool teacher = false;
  host::LossMemoryEstimate estimate;
  int64_t full_logits_bytes = 0;  // rows × vocab × the dtype's element size
};
std::string format_loss_alone(const LossAlonePlan& plan);
nlohmann::json loss_alone_to_json(const LossAlonePlan& plan);

// How much the device has: the CUDA driver's free and total memory (the
// process's own CUDA context already taken), or the host's MemAvailable for
// the CPU.
struct Capacity {
  int64_t total_bytes = 0, free_bytes = 0;
  std::string source;  // "cuda driver", "/proc/meminfo", "--gpu-memory"
};
Capacity device_capacity(const std::string& device);
// Throws naming train.device when this build or machine has no such device
// (a CUDA device without CUDA, an index past the last card). The name's
// syntax is the config's to check (config/device_name.h).
void require_device(const std::string& device);
// "96GiB", "80 GB", "1.5TiB", "512MiB", "123456" (bytes); throws naming the text.
int64_t parse_size(const std::string& text);
// "1.50 GiB"; kTooManyBytes reads "more than 8 EiB (overflow)".
std::string format_bytes(int64_t bytes);

// A memory knob (a schema property marked memoryKnob) and the largest value
// that fits with every other setting unchanged.
struct Suggestion {
  std::string section, key, label;
  int64_t current = 0, value = 0;
  std::string override_flag() const;  // "--set data.tokens_per_batch=8192"
};
struct Verdict {
  bool fits = true;
  int64_t available_bytes = 0;
  int64_t short_by = 0;  // total − available when it does not fit
  std::vector<Suggestion> suggestions;
};
// (train::check_fit, which plans the run again at each value it tries, fills it.)

// The table a person reads, and the same as JSON.
std::string format_plan(const DevicePlan& plan, const Capacity& capacity, const std::optional<Verdict>& verdict);
nlohmann::json plan_to_json(const DevicePlan& plan, const Capacity& capacity, const std::optional<Verdict>& verdict);

}  // namespace dflash::memory
