// The memory plan of a run, from its plugins: the train section and the
// plugins of a resolved config asked for their plans (plan_memory,
// estimate_memory), the arithmetic of memory/memory_plan.h applied, and
// the search for the largest value of each memory knob that fits. Here, in
// the train room, because it reads the run's settings and creates
// plugins; memory/ keeps the arithmetic that needs neither.
#pragma once

#include "memory/memory_plan.h"
#include "plugin/instances.h"
#include "plugin/registry.h"

#include <nlohmann/json.hpp>

#include <cstdint>

namespace dflash::train {

using memory::DevicePlan;
using memory::PlanRole;

// Asks every plugin of the resolved config (a `config`-style root with train,
// data, target, drafter, loss sections) and computes the plan. The loss
// answers through estimate_memory, an instance method: `loss` is the run's
// own instance (train passes the one it then trains with, so its
// constructor runs once); without it a loss instance is created for the
// plan. Throws PluginCallError / std::runtime_error naming the plugin when
// one fails.
// `world_size`: the ranks of a data-parallel run; the plan is then one rank's
// (its share of the global batch, of the optimizer under shard_optimizer,
// and the gradient buckets).
DevicePlan plan_run(const host::PluginRegistry& registry, const nlohmann::json& root,
                    const host::LossInstance* loss = nullptr, int64_t world_size = 1);
// A rank of a disaggregated run (train.mode = disaggregated): `role` is
// kTargetRank or kDrafterRank; a drafter rank's plan is one of
// train.topology.drafter_ranks.
DevicePlan plan_role(const host::PluginRegistry& registry, const nlohmann::json& root, PlanRole role,
                     const host::LossInstance* loss = nullptr);

// Every memory knob, alone (the plugins' schemas' memoryKnob properties,
// then the host's own in train_schema()): the largest value below the
// current one with which the run fits in `available_bytes`.
memory::Verdict check_fit(const host::PluginRegistry& registry, const nlohmann::json& root, const DevicePlan& plan,
                          int64_t available_bytes);

// A loss alone, without a target or drafter (plan --loss NAME --rows R
// --vocab V [--hidden H]): its estimate_memory at that shape, in the run's
// dtype and with its teacher (the train section's, defaults filled), beside
// the full [rows, V] logits a memory-bounded loss never holds. Throws
// std::invalid_argument naming the loss when it does not estimate its memory.
memory::LossAlonePlan plan_loss_alone(const host::PluginRegistry& registry, const nlohmann::json& root, int64_t rows,
                                      int64_t vocab, int64_t hidden);

}  // namespace dflash::train
