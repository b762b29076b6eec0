// The subcommands of dflash-host. Each returns the process exit status:
// 0 success, 1 a failure while running, 2 bad usage or configuration,
// 3 a feature this build does not have yet.
#pragma once

#include "cli/cli_options.h"

namespace dflash::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnavailable = 3;

int run_command(const CliOptions& options);

}  // namespace dflash::cli
