// The subcommands of dflash-host. Each returns the process exit status:
// 0 success, 1 a failure while running, 2 bad usage or configuration,
// 3 a feature this build does not have yet.
#pragma once

#include "cli/cli_options.h"
#include "plugin/registry.h"
#include "train/trainer.h"

#include <memory>

namespace dflash::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnavailable = 3;
// train::kNonFinite = 4 and train::kOutOfMemory = 5 come from the trainer.
inline constexpr int kExitDoesNotFit = 6;  // the memory plan says the run will not fit
// train::kStoppedOnRequest = 7 comes from the trainer.
inline constexpr int kExitSomeArmsFailed = 8;  // ab: the report is written, and an arm or seed failed

int run_command(const CliOptions& options);

// The plugins of one training run, created from the command line's config
// (file, --loss & co., --set) and owned together.
struct TrainSet {
  std::unique_ptr<host::DataSourceInstance> data;
  std::unique_ptr<host::TargetModelInstance> target;
  std::unique_ptr<host::DrafterInstance> drafter;
  std::unique_ptr<host::LossInstance> loss;
  std::unique_ptr<host::SchedulerInstance> scheduler;
  train::TrainRun run;
  train::TrainPlugins plugins() { return {*data, *target, *drafter, *loss, *scheduler}; }
};
host::PluginRegistry find_plugins(const CliOptions& options);
// The config as written (file, plugin flags, --set), before validation.
nlohmann::json user_config(const CliOptions& options);
std::unique_ptr<TrainSet> make_train_set(const CliOptions& options, const host::PluginRegistry& registry);

// `dflash-host ab` (cli/ab_command.cpp).
int run_ab(const CliOptions& options);

// The config's target alone: the config resolved (a target section
// required), the device checked, the plugin created.
struct TargetOnly {
  std::unique_ptr<host::TargetModelInstance> target;
  nlohmann::json train;  // the resolved "train" section (device, dtype, seed)
};
TargetOnly make_target(const CliOptions& options, const host::PluginRegistry& registry);

// `dflash-host generate` (cli/generate_command.cpp).
int run_generate(const CliOptions& options);

// What the config's target plugin says of itself before loading anything
// (its plan_memory facts: sizes, and "tokenizer" where it has one); an empty
// object when the plugin cannot plan.
nlohmann::json target_facts(const CliOptions& options, const host::PluginRegistry& registry);

// `dflash-host prepare` (cli/prepare_command.cpp).
int run_prepare(const CliOptions& options);

}  // namespace dflash::cli
