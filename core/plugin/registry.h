// Finds plugin libraries, loads them with Boost.DLL, checks them against the
// ABI, and keeps what passed. A broken library never stops the others: each
// problem is recorded as one line naming the file and the fix.
#pragma once

#include <dflash/abi.h>

#include <nlohmann/json.hpp>

#include <signal.h>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dflash::host {

struct PluginRecord {
  dflash_kind kind;
  std::string name;
  std::string version;
  std::string description;
  nlohmann::json schema;
  std::filesystem::path file;
  uint32_t abi_major = 0;
  uint32_t abi_minor = 0;
  std::string torch_build;  // "LibTorch 1.13.0 (CPU, C++11 ABI 1)", or "no LibTorch (...)"
  const dflash_plugin_descriptor* descriptor = nullptr;

  // "loss plugin 'kl' (/path/libkl.so)": how messages name it.
  std::string label() const;
};

struct LoadProblem {
  std::filesystem::path file;
  std::string message;  // one line: "<file>: <what is wrong>; <what to do>"
};

// A requested plugin that is missing or ambiguous.
class PluginLookupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class PluginRegistry {
 public:
  // log_problems: also log each skipped library as a warning (off for
  // `dflash-host list`, which prints them itself).
  explicit PluginRegistry(bool log_problems = true) : log_problems_(log_problems) {}

  // A world-writable library, or a folder that lets others replace or add
  // one, is warned about (as ssh and sudo do) unless this is set
  // (--allow-world-writable-plugins). Set it before adding anything.
  void allow_world_writable(bool allow) { allow_world_writable_ = allow; }

  // Scans `dir` recursively for shared objects (*.so). A directory the user
  // named must exist (throws std::invalid_argument otherwise).
  void add_directory(const std::filesystem::path& dir);
  // Loads one library; on failure records a LoadProblem and logs it. Logs
  // "loading <file>" first, and names the file if it crashes the process.
  void add_library(const std::filesystem::path& file);

  const std::vector<PluginRecord>& plugins() const { return plugins_; }
  const std::vector<LoadProblem>& problems() const { return problems_; }
  const std::vector<std::filesystem::path>& directories() const { return directories_; }

  // Throws PluginLookupError naming what exists (or both files of a duplicate).
  const PluginRecord& find(dflash_kind kind, const std::string& name) const;
  // All plugins of any kind with this name.
  std::vector<const PluginRecord*> find_any_kind(const std::string& name) const;

 private:
  void problem(const std::filesystem::path& file, const std::string& message);
  void add_plugin(PluginRecord record);
  void load_library(const std::filesystem::path& file);
  // Warns once per path; `why` says what a stranger could do with it.
  void warn_world_writable(const std::filesystem::path& path, const std::string& what, const std::string& why);
  void check_library_permissions(const std::filesystem::path& file);

  bool log_problems_;
  bool allow_world_writable_ = false;
  std::set<std::filesystem::path> warned_world_writable_;
  std::set<std::filesystem::path> seen_files_;
  std::vector<PluginRecord> plugins_;
  std::vector<LoadProblem> problems_;
  std::vector<std::filesystem::path> directories_;
  // (kind, name) defined by more than one library: every file that defines it.
  std::map<std::pair<int32_t, std::string>, std::vector<std::filesystem::path>> duplicates_;
};

// Plugins run in the host's process, so a plugin that crashes takes the host
// with it. While a guard lives (a library loading, a plugin's create), a
// fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE) first writes
//   dflash-host: crashed while <doing> (<signal>); in-process plugins can crash the host; ...
// to stderr, then takes the signal's default action: the process still dies
// as it would have (same signal, core dump), but the line names the plugin.
// Guards nest; the previous handlers come back when one ends. One thread
// loads plugins, so the guard assumes no other is installing handlers.
class PluginCrashGuard {
 public:
  explicit PluginCrashGuard(const std::string& doing);
  ~PluginCrashGuard();
  PluginCrashGuard(const PluginCrashGuard&) = delete;
  PluginCrashGuard& operator=(const PluginCrashGuard&) = delete;

 private:
  std::string previous_message_;
  std::vector<struct sigaction> previous_actions_;
};

// Describes a LibTorch build for messages.
std::string describe_torch_build(const dflash_torch_build* build);

}  // namespace dflash::host
