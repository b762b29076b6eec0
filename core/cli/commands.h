// The subcommands of dflash-host. Each returns the process exit status
// (runtime/exit_codes.h).
#pragma once

#include "cli/cli_options.h"
#include "plugin/registry.h"
#include "runtime/exit_codes.h"
#include "train/trainer.h"

#include <memory>

namespace dflash::cli {

int run_command(const CliOptions& options);

// `dflash-host launch --nproc-per-node N [--] ARGS…` (cli/launch_command.cpp):
// the whole command line, as main() got it.
int run_launch(int argc, char** argv);

host::PluginRegistry find_plugins(const CliOptions& options);
// The command line's "train" section, resolved (defaults filled) and typed.
train::TrainSettings train_settings(const CliOptions& options, const host::PluginRegistry& registry);
// The run of the command line's config (file, --loss & co., --set): its
// five plugins created, the device checked.
std::unique_ptr<train::Run> make_run(const CliOptions& options, const host::PluginRegistry& registry);

// `dflash-host ab` (cli/ab_command.cpp).
int run_ab(const CliOptions& options);

// The config's target alone: the config resolved (a target section
// required), the device checked, the plugin created.
struct TargetOnly {
  std::unique_ptr<host::TargetModelInstance> target;
  train::TrainSettings settings;  // the resolved "train" section
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

// The config's data source alone, its vocab_size of 0 made `target_vocab`;
// with epochs > 0, set to end after that many (refused, naming the plugin,
// when it has no "epochs" setting).
std::unique_ptr<host::DataSourceInstance> make_data_source(const CliOptions& options, const host::PluginRegistry& registry,
                                                           int64_t target_vocab, int64_t epochs);

// `dflash-host token-counts` (cli/token_counts_command.cpp).
int run_token_counts(const CliOptions& options);

}  // namespace dflash::cli
