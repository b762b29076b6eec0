// One run: its typed settings, its five plugin instances (created once, by
// the caller, from the resolved config), the target bound to the drafter
// once, and the drafter's facts. train, eval, ab and first-step gradients
// all work on a Run; the trainer's stages (train/trainer.cpp) read it.
#pragma once

#include "plugin/drafter_facts.h"
#include "plugin/instances.h"
#include "train/train_settings.h"

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <memory>

namespace dflash::train {

// The instances; eval leaves data, loss and scheduler empty.
struct RunPlugins {
  std::unique_ptr<host::DataSourceInstance> data;
  std::unique_ptr<host::TargetModelInstance> target;
  std::unique_ptr<host::DrafterInstance> drafter;
  std::unique_ptr<host::LossInstance> loss;
  std::unique_ptr<host::SchedulerInstance> scheduler;
  // {section: plugin_identity} of plugins this process does not instantiate
  // (a disaggregated run's target ranks hold no drafter, its drafter ranks
  // no target): recorded and compared like the instances' own.
  nlohmann::json identities_elsewhere = nlohmann::json::object();
};

// How the host creates every instance of a run: device, dtype, seed.
host::InstanceOptions instance_options(const TrainSettings& settings);

class Run {
 public:
  // `resolved_config`: the whole resolved config (recorded in checkpoints);
  // its "train" section is parsed here, once.
  Run(RunPlugins plugins, nlohmann::json resolved_config);

  const TrainSettings& settings() const { return settings_; }
  const nlohmann::json& resolved_config() const { return resolved_config_; }

  // The instances; each throws std::logic_error when this run has none.
  host::DataSourceInstance& data() const;
  host::TargetModelInstance& target() const;
  host::DrafterInstance& drafter() const;
  host::LossInstance& loss() const;
  host::SchedulerInstance& scheduler() const;

  // Binds the target to the drafter on the settings' device and dtype: the
  // drafter gets the target's facts and its own copies of the frozen weights;
  // the run keeps the lm_head (for the loss) and drops the other copies (the
  // drafter keeps what it needs, where it wants it). Then reads the drafter's
  // facts, refusing a drafter that does not state them. Once: a second call
  // does nothing.
  void bind();
  bool bound() const { return bound_; }
  // A drafter rank of a disaggregated run binds its drafter to a target that
  // lives on other ranks: `target_info` is that target's describe(),
  // `frozen` its frozen weights as received (placed here on this run's
  // device and dtype).
  void bind_to_remote_target(nlohmann::json target_info, const host::NamedTensors& frozen);
  // A target rank of a disaggregated run learns the drafter's facts from
  // the drafter ranks: `exported` is the drafter's export_config, `label`
  // names the plugin.
  void adopt_remote_drafter(nlohmann::json exported, const std::string& label);

  bool has_data() const { return plugins_.data != nullptr; }
  bool has_target() const { return plugins_.target != nullptr; }
  bool has_drafter() const { return plugins_.drafter != nullptr; }

  // The target's describe() (available before bind).
  const nlohmann::json& target_info() const { return target_info_; }
  // After bind: the drafter's export_config, its typed facts, the lm_head.
  const nlohmann::json& drafter_config() const;
  const host::DrafterFacts& drafter_facts() const;
  // The loss's head: the target's lm_head, or the drafter's own (ABI 1.6
  // loss_heads); with the latter, the teacher's head over the same tokens
  // (undefined otherwise: the teacher shares lm_head).
  const at::Tensor& lm_head() const;
  const at::Tensor& teacher_lm_head() const;

  // The libraries of the instances, {section: plugin_identity}: recorded in
  // checkpoints, compared on resume and across ranks.
  nlohmann::json plugin_identities() const;

 private:
  void require_bound(const char* what) const;
  void bind_drafter(const host::NamedTensors& frozen_on_device);
  // A drafter with its own head: checks it against the settings and the loss.
  void adopt_loss_heads(const host::DrafterInstance::LossHeads& heads);
  // Refuses a drafter that keeps its parameters, or a lm_head, off this
  // run's device (the seed's verifier weights left on another GPU).
  void verify_placement() const;

  RunPlugins plugins_;
  nlohmann::json resolved_config_;
  TrainSettings settings_;
  nlohmann::json target_info_;
  bool bound_ = false;
  nlohmann::json drafter_config_;
  host::DrafterFacts facts_;
  at::Tensor lm_head_, teacher_lm_head_;
};

}  // namespace dflash::train
