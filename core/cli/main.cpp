// dflash-host: the entry point. Parses the command line, runs a subcommand,
// and turns every failure into one clear line on stderr and an exit status.
#include "cli/cli_options.h"
#include "cli/commands.h"
#include "config/config_schema.h"
#include "log/log.h"
#include "memory/cpu_tensor_bytes.h"
#include "plugin/host_api.h"
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "runtime/cpu_blas.h"

#include <dflash/abi.h>

#include <malloc.h>

#include <iostream>

int main(int argc, char** argv) {
  using namespace dflash;
  // Training allocates and frees the same large CPU buffers every step. glibc
  // would hand each one back to the kernel (mmap above 32 MiB, heap trimming)
  // and fault the pages in again next step; keeping them in the heap cuts the
  // CPU quickstart's system time by more than half.
  ::mallopt(M_MMAP_THRESHOLD, 512 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // CPU tensors are counted from here on, so a CPU run's memory figures are
  // tensor bytes, comparable with the planner's (memory/cpu_tensor_bytes.h).
  memory::install_cpu_tensor_counter();
  // `launch` starts the ranks; its arguments after the launcher's own are
  // theirs, not parsed here.
  if (argc > 1 && std::string(argv[1]) == "launch") return cli::run_launch(argc, argv);
  cli::CliOptions options;
  try {
    options = cli::parse_command_line(argc, argv);
    log::set_level(options.log_level);
  } catch (const std::exception& e) {
    std::cerr << "dflash-host: " << e.what() << "\n";
    return kExitUsage;
  }
  if (options.help) {
    std::cout << cli::usage_text();
    return kExitOk;
  }
  if (options.version) {
    std::cout << "dflash-host " << DFLASH_HOST_VERSION << ", plugin ABI " << DFLASH_ABI_MAJOR << "." << DFLASH_ABI_MINOR
              << ", " << host::describe_torch_build(host::host_torch_build()) << "\n";
    return kExitOk;
  }
  if (const auto warning = runtime::openblas_core_warning()) log::warn(*warning);
  try {
    return cli::run_command(options);
  } catch (const config::ConfigError& e) {
    std::cerr << log::program_prefix() << "config error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const host::PluginLookupError& e) {
    std::cerr << log::program_prefix() << e.what() << "\n";
    return kExitUsage;
  } catch (const std::invalid_argument& e) {
    std::cerr << log::program_prefix() << e.what() << "\n";
    return kExitUsage;
  } catch (const host::PluginCallError& e) {
    std::cerr << log::program_prefix() << e.what() << "\n";
    return kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << log::program_prefix() << e.what() << "\n";
    return kExitFailure;
  }
}
