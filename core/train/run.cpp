#include "train/run.h"

#include "plugin/plugin_identity.h"
#include "plugin/plugin_kind.h"
#include "train/frozen_weights.h"

#include <dflash/sdk/torch.hpp>

#include <stdexcept>

namespace dflash::train {
namespace {

template <class Instance>
Instance& present(const std::unique_ptr<Instance>& instance, const char* kind) {
  if (!instance) throw std::logic_error(std::string("this run has no ") + kind + " plugin");
  return *instance;
}

}  // namespace

host::InstanceOptions instance_options(const TrainSettings& settings) {
  host::InstanceOptions options;
  options.device = settings.device;
  options.dtype = settings.dtype;
  options.seed = settings.seed;
  return options;
}

Run::Run(RunPlugins plugins, nlohmann::json resolved_config)
    : plugins_(std::move(plugins)),
      resolved_config_(std::move(resolved_config)),
      settings_(parse_train_settings(resolved_config_.at("train"))) {
  if (plugins_.target) target_info_ = plugins_.target->describe();
}

host::DataSourceInstance& Run::data() const { return present(plugins_.data, "data source"); }
host::TargetModelInstance& Run::target() const { return present(plugins_.target, "target model"); }
host::DrafterInstance& Run::drafter() const { return present(plugins_.drafter, "drafter"); }
host::LossInstance& Run::loss() const { return present(plugins_.loss, "loss"); }
host::SchedulerInstance& Run::scheduler() const { return present(plugins_.scheduler, "scheduler"); }

void Run::bind() {
  if (bound_) return;
  bind_drafter(host::place_frozen_weights(target().frozen_weights(), target().record().name, c10::Device(settings_.device),
                                          sdk::parse_dtype(settings_.dtype)));
}

void Run::bind_to_remote_target(nlohmann::json target_info, const host::NamedTensors& frozen) {
  if (bound_) return;
  target_info_ = std::move(target_info);
  bind_drafter(host::place_frozen_weights(frozen, "the target on the target ranks", c10::Device(settings_.device),
                                          sdk::parse_dtype(settings_.dtype)));
}

void Run::bind_drafter(const host::NamedTensors& frozen_on_device) {
  drafter().bind_target(target_info_, frozen_on_device);
  lm_head_ = host::find_tensor(frozen_on_device, "lm_head");
  if (auto heads = drafter().loss_heads()) adopt_loss_heads(*heads);
  drafter_config_ = drafter().export_config().value_or(nlohmann::json::object());
  facts_ = host::drafter_facts(drafter());
  verify_placement();
  bound_ = true;
}

void Run::adopt_loss_heads(const host::DrafterInstance::LossHeads& heads) {
  const std::string who = drafter().record().label();
  bool among_parameters = false;
  for (const auto& entry : drafter().parameters()) among_parameters = among_parameters || entry.second.is_same(heads.lm_head);
  if (!among_parameters)
    throw std::invalid_argument(who + ": loss_heads' lm_head is not one of its parameters, so the optimizer would never "
                                      "update it; return the same tensor from both");
  if (settings_.wants_teacher()) {
    if (!heads.teacher_lm_head.defined())
      throw std::invalid_argument(who + " scores with a head of its own over " + std::to_string(heads.lm_head.size(0)) +
                                  " tokens and gave no teacher_lm_head to score the target's hidden states with; train "
                                  "with train.teacher = \"none\" (hard labels), or have loss_heads return one");
    if (plugins_.loss != nullptr && !loss().reads_teacher_head())
      throw std::invalid_argument(who + " scores its teacher through a head of its own, and " + loss().teacher_head_refusal());
    teacher_lm_head_ = heads.teacher_lm_head;
  }
  lm_head_ = heads.lm_head;
}

void Run::adopt_remote_drafter(nlohmann::json exported, const std::string& label) {
  if (bound_) return;
  facts_ = host::parse_drafter_facts(exported, label);
  drafter_config_ = std::move(exported);
  bound_ = true;
}

void Run::verify_placement() const {
  const c10::Device device(settings_.device);
  auto refuse = [&](const std::string& what, const at::Tensor& t) {
    throw std::invalid_argument(drafter().record().label() + ": " + what + " is on " + t.device().str() +
                                ", but this rank trains on " + device.str() +
                                " (train.device). Every tensor a step uses must live on the rank's own device: one "
                                "left on another device (the seed's frozen verifier weights on the wrong GPU) costs a "
                                "copy per step and memory on a GPU that has none to spare. Fix the plugin: keep what "
                                "bind_target hands over on its device");
  };
  if (lm_head_.defined() && !host::same_device(lm_head_.device(), device)) refuse("the lm_head", lm_head_);
  if (teacher_lm_head_.defined() && !host::same_device(teacher_lm_head_.device(), device))
    refuse("the teacher's lm_head", teacher_lm_head_);
  for (const auto& [name, tensor] : drafter().parameters())
    if (!host::same_device(tensor.device(), device)) refuse("parameter '" + name + "'", tensor);
}

void Run::require_bound(const char* what) const {
  if (!bound_) throw std::logic_error(std::string("Run::") + what + " before Run::bind()");
}
const nlohmann::json& Run::drafter_config() const {
  require_bound("drafter_config");
  return drafter_config_;
}
const host::DrafterFacts& Run::drafter_facts() const {
  require_bound("drafter_facts");
  return facts_;
}
const at::Tensor& Run::lm_head() const {
  require_bound("lm_head");
  return lm_head_;
}

const at::Tensor& Run::teacher_lm_head() const {
  require_bound("teacher_lm_head");
  return teacher_lm_head_;
}

nlohmann::json Run::plugin_identities() const {
  nlohmann::json out = plugins_.identities_elsewhere.is_object() ? plugins_.identities_elsewhere : nlohmann::json::object();
  auto add = [&](const host::PluginInstance* instance) {
    if (instance) out[host::kind_section(instance->record().kind)] = host::plugin_identity(instance->record());
  };
  add(plugins_.data.get());
  add(plugins_.target.get());
  add(plugins_.drafter.get());
  add(plugins_.loss.get());
  add(plugins_.scheduler.get());
  return out;
}

}  // namespace dflash::train
