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
  host::NamedTensors frozen = host::place_frozen_weights(target().frozen_weights(), target().record().name,
                                                         c10::Device(settings_.device), sdk::parse_dtype(settings_.dtype));
  drafter().bind_target(target_info_, frozen);
  lm_head_ = host::find_tensor(frozen, "lm_head");
  frozen.clear();
  drafter_config_ = drafter().export_config().value_or(nlohmann::json::object());
  facts_ = host::drafter_facts(drafter());
  bound_ = true;
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

nlohmann::json Run::plugin_identities() const {
  nlohmann::json out = nlohmann::json::object();
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
