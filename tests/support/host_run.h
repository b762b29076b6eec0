// Runs the built dflash-host as a user would (the in-tree plugins only) and
// keeps its exit status, stdout and stderr. The including test defines
// DFLASH_HOST_EXE and DFLASH_INTREE_PLUGIN_DIR (tests/CMakeLists.txt).
#pragma once

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace dflash::test {

struct HostRun {
  int status = -1;
  std::string out, err;
};

// `args` after the plugin flags; stderr goes through a file in `scratch`.
inline HostRun run_host(const std::string& args, const std::filesystem::path& scratch) {
  const std::filesystem::path err_file = scratch / ("stderr_" + std::to_string(::getpid()));
  const std::string command = std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs --plugin-dir " +
                              DFLASH_INTREE_PLUGIN_DIR + " " + args + " 2>" + err_file.string();
  HostRun run;
  FILE* pipe = popen(command.c_str(), "r");
  std::array<char, 4096> buffer{};
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) run.out.append(buffer.data(), n);
  const int raw = pclose(pipe);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream err(err_file);
  run.err.assign(std::istreambuf_iterator<char>(err), {});
  ::unlink(err_file.c_str());
  return run;
}

}  // namespace dflash::test
