// dflash-host: the entry point. Parses the command line, runs a subcommand,
// and turns every failure into one clear line on stderr and an exit status.
#include "cli/cli_options.h"
#include "cli/commands.h"
#include "config/config_schema.h"
#include "log/log.h"
#include "plugin/host_api.h"
#include "plugin/instances.h"
#include "plugin/registry.h"

#include <dflash/abi.h>

#include <iostream>

int main(int argc, char** argv) {
  using namespace dflash;
  cli::CliOptions options;
  try {
    options = cli::parse_command_line(argc, argv);
    log::set_level(options.log_level);
  } catch (const std::exception& e) {
    std::cerr << "dflash-host: " << e.what() << "\n";
    return cli::kExitUsage;
  }
  if (options.help) {
    std::cout << cli::usage_text();
    return cli::kExitOk;
  }
  if (options.version) {
    std::cout << "dflash-host " << DFLASH_HOST_VERSION << ", plugin ABI " << DFLASH_ABI_MAJOR << "." << DFLASH_ABI_MINOR
              << ", " << host::describe_torch_build(host::host_torch_build()) << "\n";
    return cli::kExitOk;
  }
  try {
    return cli::run_command(options);
  } catch (const config::ConfigError& e) {
    std::cerr << "dflash-host: config error: " << e.what() << "\n";
    return cli::kExitUsage;
  } catch (const host::PluginLookupError& e) {
    std::cerr << "dflash-host: " << e.what() << "\n";
    return cli::kExitUsage;
  } catch (const std::invalid_argument& e) {
    std::cerr << "dflash-host: " << e.what() << "\n";
    return cli::kExitUsage;
  } catch (const host::PluginCallError& e) {
    std::cerr << "dflash-host: " << e.what() << "\n";
    return cli::kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << "dflash-host: " << e.what() << "\n";
    return cli::kExitFailure;
  }
}
