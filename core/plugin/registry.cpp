#include "plugin/registry.h"

#include "config/config_schema.h"
#include "log/log.h"
#include "plugin/host_api.h"
#include "plugin/plugin_kind.h"

#include <boost/dll/shared_library.hpp>
#include <dlfcn.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace dflash::host {
namespace fs = std::filesystem;

namespace {

// Libraries are never unloaded: objects, exception types and function
// pointers from a plugin would dangle. Deliberately leaked.
std::vector<boost::dll::shared_library>& loaded_libraries() {
  static auto* libraries = new std::vector<boost::dll::shared_library>();
  return *libraries;
}

std::string abi_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

bool has_elf_magic(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "\x7f" "ELF", 4) == 0;
}

// Boost.DLL clears dlerror(); to tell the user why the dynamic loader said
// no, repeat the dlopen (only on this failure path) and read its message.
std::string dynamic_loader_reason(const fs::path& file) {
  dlerror();
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return "it loaded on a second try";  // keep it: never unload
  const char* reason = dlerror();
  return reason ? reason : "unknown reason";
}

bool is_world_writable(const fs::path& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && (info.st_mode & S_IWOTH);
}

bool is_sticky(const fs::path& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && (info.st_mode & S_ISVTX);
}

// --- the crash guard ---
// A signal handler may call only async-signal-safe functions, so the line it
// writes is prepared before the plugin code runs: the handler only copies
// these bytes and the signal's name with write(2).
constexpr int kFatalSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE};
constexpr size_t kCrashMessageCapacity = 4096;
char crash_message[kCrashMessageCapacity];  // "dflash-host: crashed while <doing> ("
volatile sig_atomic_t crash_message_length = 0;
constexpr char kCrashAdvice[] =
    "); in-process plugins can crash the host: fix the plugin, or move its library out of the plugin directories\n";

const char* signal_label(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV, segmentation fault";
    case SIGABRT: return "SIGABRT, aborted";
    case SIGBUS: return "SIGBUS, bus error";
    case SIGILL: return "SIGILL, illegal instruction";
    case SIGFPE: return "SIGFPE, arithmetic exception";
  }
  return "a fatal signal";
}

void write_stderr(const char* text, size_t length) {
  while (length > 0) {
    const ssize_t written = ::write(STDERR_FILENO, text, length);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;
    text += written;
    length -= static_cast<size_t>(written);
  }
}

size_t text_length(const char* text) {  // strlen, spelled out: this runs in a signal handler
  size_t n = 0;
  while (text[n] != '\0') ++n;
  return n;
}

extern "C" void on_plugin_crash(int sig) {
  write_stderr(crash_message, static_cast<size_t>(crash_message_length));
  const char* label = signal_label(sig);
  write_stderr(label, text_length(label));
  write_stderr(kCrashAdvice, sizeof(kCrashAdvice) - 1);
  // SA_RESETHAND put the default action back and SA_NODEFER left the signal
  // unblocked: raising it again ends the process as the signal would have.
  ::raise(sig);
}

void set_crash_message(const std::string& text) {
  crash_message_length = 0;  // a signal meanwhile writes nothing rather than a torn line
  const size_t length = std::min(text.size(), kCrashMessageCapacity);
  std::memcpy(crash_message, text.data(), length);
  crash_message_length = static_cast<sig_atomic_t>(length);
}

std::string current_crash_message() {
  return std::string(crash_message, static_cast<size_t>(crash_message_length));
}

// A plugin that overflows its stack faults with no stack left to run the
// handler on; give it one (once, unless someone already did).
void ensure_alternate_signal_stack() {
  static char stack[64 * 1024];
  stack_t current{};
  if (::sigaltstack(nullptr, &current) != 0 || !(current.ss_flags & SS_DISABLE)) return;
  stack_t ours{};
  ours.ss_sp = stack;
  ours.ss_size = sizeof(stack);
  ::sigaltstack(&ours, nullptr);
}

struct SlotRule {
  const char* name;
  size_t offset;
};
struct VtableRule {
  size_t minimum_size;  // struct_size of the ABI 1.0 table
  std::vector<SlotRule> required;
};

#define DFLASH_SLOT(type, field) SlotRule{#field, offsetof(type, field)}
const VtableRule& vtable_rule(dflash_kind kind) {
  static const VtableRule data{DFLASH_SIZE_THROUGH(dflash_data_source_vtable, describe),
                               {DFLASH_SLOT(dflash_data_source_vtable, next_batch),
                                DFLASH_SLOT(dflash_data_source_vtable, save_state),
                                DFLASH_SLOT(dflash_data_source_vtable, load_state)}};
  static const VtableRule target{DFLASH_SIZE_THROUGH(dflash_target_vtable, frozen_weights),
                                 {DFLASH_SLOT(dflash_target_vtable, describe), DFLASH_SLOT(dflash_target_vtable, forward),
                                  DFLASH_SLOT(dflash_target_vtable, frozen_weights)}};
  static const VtableRule drafter{DFLASH_SIZE_THROUGH(dflash_drafter_vtable, set_training),
                                  {DFLASH_SLOT(dflash_drafter_vtable, parameters),
                                   DFLASH_SLOT(dflash_drafter_vtable, bind_target),
                                   DFLASH_SLOT(dflash_drafter_vtable, forward)}};
  static const VtableRule loss{DFLASH_SIZE_THROUGH(dflash_loss_vtable, estimate_memory),
                               {DFLASH_SLOT(dflash_loss_vtable, compute)}};
  static const VtableRule scheduler{DFLASH_SIZE_THROUGH(dflash_scheduler_vtable, load_state),
                                    {DFLASH_SLOT(dflash_scheduler_vtable, lr_at)}};
  switch (kind) {
    case DFLASH_KIND_DATA_SOURCE: return data;
    case DFLASH_KIND_TARGET_MODEL: return target;
    case DFLASH_KIND_DRAFTER: return drafter;
    case DFLASH_KIND_LOSS: return loss;
    case DFLASH_KIND_SCHEDULER: return scheduler;
  }
  return loss;  // unreachable: kinds are checked before
}
#undef DFLASH_SLOT

bool slot_is_null(const void* table, size_t offset) {
  void (*slot)(void) = nullptr;
  std::memcpy(&slot, static_cast<const char*>(table) + offset, sizeof(slot));
  return slot == nullptr;
}

bool valid_plugin_name(const char* name) {
  if (name == nullptr || *name == '\0') return false;
  for (const char* c = name; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return false;
  return true;
}

bool same_text(const char* a, const char* b) { return a && b && std::strcmp(a, b) == 0; }

// Checks one descriptor; returns an empty string when it is sound.
std::string check_descriptor(const dflash_plugin_descriptor* d, PluginRecord& record) {
  if (d == nullptr) return "lists a NULL plugin descriptor; the library is corrupt, rebuild it";
  const size_t minimum = DFLASH_SIZE_THROUGH(dflash_plugin_descriptor, vtable);
  if (d->struct_size < minimum)
    return "plugin descriptor struct_size is " + std::to_string(d->struct_size) + " bytes, smaller than the " +
           std::to_string(minimum) + " of ABI 1.0; the library was built with a broken SDK, rebuild it with dflash-sdk";
  const std::string name = valid_plugin_name(d->name) ? d->name : "";
  const std::string who = name.empty() ? std::string("a plugin") : "plugin '" + name + "'";
  if (!is_known_kind(d->kind))
    return who + " declares unknown kind " + std::to_string(d->kind) +
           " (known: 1 data source, 2 target model, 3 drafter, 4 loss, 5 scheduler); rebuild it with this host's SDK";
  const auto kind = static_cast<dflash_kind>(d->kind);
  const std::string kind_who = std::string(kind_display(kind)) + " " + who;
  if (name.empty())
    return std::string(kind_display(kind)) + " plugin has an invalid name '" + (d->name ? d->name : "(null)") +
           "'; names use only a-z, 0-9 and _";
  if (d->create == nullptr) return kind_who + " leaves required slot 'create' NULL; implement it";
  if (d->destroy == nullptr) return kind_who + " leaves required slot 'destroy' NULL; implement it";
  if (d->vtable == nullptr) return kind_who + " has no vtable (NULL); set the descriptor's vtable to its dflash_" +
                                   kind_section(kind) + " table";
  const VtableRule& rule = vtable_rule(kind);
  const size_t table_size = *static_cast<const size_t*>(d->vtable);  // struct_size comes first in every table
  if (table_size < rule.minimum_size)
    return kind_who + " vtable struct_size is " + std::to_string(table_size) + " bytes, smaller than the " +
           std::to_string(rule.minimum_size) + " of ABI 1.0; rebuild it with dflash-sdk";
  for (const SlotRule& slot : rule.required)
    if (slot_is_null(d->vtable, slot.offset))
      return kind_who + " leaves required vtable slot '" + slot.name + "' NULL; implement it";
  // Optional groups (ABI 1.1): where the table reaches them, all or none.
  auto group = [&](const char* what, std::initializer_list<SlotRule> slots, size_t through) -> std::string {
    if (table_size < through) return "";
    std::vector<std::string> null_slots, filled;
    for (const SlotRule& slot : slots) (slot_is_null(d->vtable, slot.offset) ? null_slots : filled).push_back(slot.name);
    if (filled.empty() || null_slots.empty()) return "";
    std::string list;
    for (const auto& n : null_slots) list += (list.empty() ? "'" : ", '") + n + "'";
    return kind_who + " implements part of the optional " + what + " group: " + list +
           " NULL; set all of its slots or none";
  };
  if (kind == DFLASH_KIND_TARGET_MODEL) {
    const std::string problem = group("decoding",
                                      {SlotRule{"decode_begin", offsetof(dflash_target_vtable, decode_begin)}, SlotRule{"decode_extend", offsetof(dflash_target_vtable, decode_extend)},
                                       SlotRule{"decode_truncate", offsetof(dflash_target_vtable, decode_truncate)}, SlotRule{"decode_end", offsetof(dflash_target_vtable, decode_end)}},
                                      DFLASH_SIZE_THROUGH(dflash_target_vtable, decode_end));
    if (!problem.empty()) return problem;
    // ABI 1.3: batched decoding steps sessions that only the group opens.
    if (table_size >= DFLASH_SIZE_THROUGH(dflash_target_vtable, decode_extend_batch) &&
        !slot_is_null(d->vtable, offsetof(dflash_target_vtable, decode_extend_batch)) &&
        slot_is_null(d->vtable, offsetof(dflash_target_vtable, decode_begin)))
      return kind_who + " sets 'decode_extend_batch' without the decoding group (decode_begin, decode_extend, "
                        "decode_truncate, decode_end); set the group too, or leave decode_extend_batch NULL";
    // ABI 1.4: tree verification, a pair, on sessions the decoding group opens.
    const std::string tree = group("tree verification",
                                   {SlotRule{"decode_verify_tree", offsetof(dflash_target_vtable, decode_verify_tree)},
                                    SlotRule{"decode_accept_path", offsetof(dflash_target_vtable, decode_accept_path)}},
                                   DFLASH_SIZE_THROUGH(dflash_target_vtable, decode_accept_path));
    if (!tree.empty()) return tree;
    if (table_size >= DFLASH_SIZE_THROUGH(dflash_target_vtable, decode_accept_path) &&
        !slot_is_null(d->vtable, offsetof(dflash_target_vtable, decode_verify_tree)) &&
        slot_is_null(d->vtable, offsetof(dflash_target_vtable, decode_begin)))
      return kind_who + " sets 'decode_verify_tree' and 'decode_accept_path' without the decoding group (decode_begin, "
                        "decode_extend, decode_truncate, decode_end); set the group too, or leave both NULL";
  }
  if (kind == DFLASH_KIND_DRAFTER) {
    // ABI 1.5: export_config, optional before, is required (the host reads
    // the drafter's block and layers from it).
    if (record.abi_minor >= 5 && slot_is_null(d->vtable, offsetof(dflash_drafter_vtable, export_config)))
      return kind_who + " (ABI " + abi_string(record.abi_major, record.abi_minor) +
             ") leaves vtable slot 'export_config' NULL, required since ABI 1.5: it must state block_size and "
             "target_layer_ids (docs/writing-plugins.md, drafter); implement it";
    const std::string problem = group("drafting",
                                      {SlotRule{"draft_begin", offsetof(dflash_drafter_vtable, draft_begin)}, SlotRule{"draft_extend", offsetof(dflash_drafter_vtable, draft_extend)},
                                       SlotRule{"draft_propose", offsetof(dflash_drafter_vtable, draft_propose)}, SlotRule{"draft_end", offsetof(dflash_drafter_vtable, draft_end)}},
                                      DFLASH_SIZE_THROUGH(dflash_drafter_vtable, draft_end));
    if (!problem.empty()) return problem;
    // ABI 1.4: a tree's candidates come from the sessions the drafting group opens.
    if (table_size >= DFLASH_SIZE_THROUGH(dflash_drafter_vtable, draft_propose_topk) &&
        !slot_is_null(d->vtable, offsetof(dflash_drafter_vtable, draft_propose_topk)) &&
        slot_is_null(d->vtable, offsetof(dflash_drafter_vtable, draft_begin)))
      return kind_who + " sets 'draft_propose_topk' without the drafting group (draft_begin, draft_extend, "
                        "draft_propose, draft_end); set the group too, or leave draft_propose_topk NULL";
  }
  if (kind == DFLASH_KIND_SCHEDULER) {
    const auto* table = static_cast<const dflash_scheduler_vtable*>(d->vtable);
    if ((table->save_state == nullptr) != (table->load_state == nullptr))
      return kind_who + " sets only one of the optional slots 'save_state'/'load_state'; set both or neither";
  }
  nlohmann::json schema;
  try {
    schema = nlohmann::json::parse(d->config_schema_json ? d->config_schema_json : "");
    config::check_schema(schema);
  } catch (const std::exception& e) {
    return kind_who + " has an invalid config schema: " + e.what() + "; fix its config_schema()";
  }
  record.kind = kind;
  record.name = name;
  record.version = d->version ? d->version : "";
  record.description = d->description ? d->description : "";
  record.schema = std::move(schema);
  record.descriptor = d;
  return {};
}

}  // namespace

std::string PluginRecord::label() const {
  return std::string(kind_display(kind)) + " plugin '" + name + "' (" + file.string() + ")";
}

std::string describe_torch_build(const dflash_torch_build* build) {
  if (build == nullptr) return "no LibTorch (exchanges no LibTorch tensors)";
  std::string cuda = build->cuda_version ? build->cuda_version : "?";
  return std::string("LibTorch ") + (build->torch_version ? build->torch_version : "?") + " (" +
         (cuda == "none" ? std::string("CPU") : "CUDA " + cuda) + ", C++11 ABI " + std::to_string(build->cxx11_abi) + ")";
}

PluginCrashGuard::PluginCrashGuard(const std::string& doing) : previous_message_(current_crash_message()) {
  ensure_alternate_signal_stack();
  set_crash_message("dflash-host: crashed while " + doing + " (");
  struct sigaction action {};
  action.sa_handler = on_plugin_crash;
  action.sa_flags = SA_RESETHAND | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int sig : kFatalSignals) {
    struct sigaction previous {};
    ::sigaction(sig, &action, &previous);
    previous_actions_.push_back(previous);
  }
}

PluginCrashGuard::~PluginCrashGuard() {
  for (size_t i = 0; i < previous_actions_.size(); ++i) ::sigaction(kFatalSignals[i], &previous_actions_[i], nullptr);
  set_crash_message(previous_message_);
}

void PluginRegistry::problem(const fs::path& file, const std::string& message) {
  problems_.push_back({file, file.string() + ": " + message});
  if (log_problems_) log::warn("skipped plugin library " + problems_.back().message);
}

void PluginRegistry::warn_world_writable(const fs::path& path, const std::string& what, const std::string& why) {
  if (allow_world_writable_ || !warned_world_writable_.insert(path).second) return;
  log::warn(what + " " + path.string() + " is world-writable: " + why + "; run `chmod o-w " + path.string() +
            "` (or pass --allow-world-writable-plugins to silence this warning)");
}

// The library itself, and every folder above it that would let another user
// replace it: one writable by all without the sticky bit (with it, as in
// /tmp, others cannot rename or delete what is not theirs).
void PluginRegistry::check_library_permissions(const fs::path& file) {
  if (allow_world_writable_) return;
  if (is_world_writable(file))
    warn_world_writable(file, "plugin library", "any user can replace the code dflash-host runs");
  for (fs::path folder = file.parent_path();; folder = folder.parent_path()) {
    if (is_world_writable(folder) && !is_sticky(folder))
      warn_world_writable(folder, "folder", "any user can replace the plugin library " + file.string() + " beneath it");
    if (folder == folder.parent_path()) break;
  }
}

void PluginRegistry::add_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::invalid_argument("plugin directory '" + dir.string() + "' does not exist or is not a directory; "
                             "check --plugin-dir (the build puts plugins in <build>/lib/dflash-host/plugins)");
  const fs::path canonical = fs::weakly_canonical(dir);
  if (std::find(directories_.begin(), directories_.end(), canonical) != directories_.end()) return;
  directories_.push_back(canonical);
  std::vector<fs::path> files, folders{canonical};
  for (auto it = fs::recursive_directory_iterator(canonical, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec)) folders.push_back(it->path());
    else if (it->is_regular_file(ec) && it->path().extension() == ".so") files.push_back(it->path());
  }
  log::info("plugin directory " + canonical.string() + ": " + std::to_string(files.size()) + " librar" +
            (files.size() == 1 ? "y" : "ies"));
  // Everything in a searched folder is loaded, so one that others can write
  // to lets them add code to the host, sticky bit or not.
  for (const fs::path& folder : folders)
    if (is_world_writable(folder))
      warn_world_writable(folder, "plugin directory", "any user can put a library there that dflash-host loads and runs");
  std::sort(files.begin(), files.end());  // deterministic: the same order on every run
  for (const fs::path& file : files) add_library(file);
}

void PluginRegistry::add_library(const fs::path& given) {
  const fs::path file = fs::weakly_canonical(given);
  // Overlapping search paths (a folder and its parent, a default folder also
  // given with --plugin-dir) reach the same file twice: one library, one load.
  if (!seen_files_.insert(file).second) return;
  if (!has_elf_magic(file)) {
    problem(file, "not a shared object (no ELF header); remove it from the plugin directory, or rebuild it as a "
                  "shared library with dflash_add_plugin()");
    return;
  }
  check_library_permissions(file);
  // Loading runs the library's static initialisers and its entry function:
  // plugin code, in this process. If it hangs, this line names it; if it
  // crashes, the guard's line does.
  log::info("loading " + file.string());
  const PluginCrashGuard guard("loading plugin library " + file.string());
  load_library(file);
}

void PluginRegistry::load_library(const fs::path& file) {
  boost::dll::shared_library library;
  boost::dll::fs::error_code ec;
  library.load(file, ec, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  if (ec) {
    problem(file, "the dynamic loader refused it (" + dynamic_loader_reason(file) +
                      "); check its dependencies with `ldd " + file.string() + "`");
    return;
  }
  loaded_libraries().push_back(library);  // stays loaded for the life of the process

  if (!library.has(DFLASH_ENTRY_SYMBOL)) {
    for (uint32_t major = 0; major < 100; ++major) {
      if (major == DFLASH_ABI_MAJOR) continue;
      const std::string other = DFLASH_ENTRY_SYMBOL_PREFIX + std::to_string(major);
      if (library.has(other)) {
        problem(file, "built for plugin ABI " + std::to_string(major) + ".x (exports " + other +
                          "), but this host speaks ABI " + abi_string(DFLASH_ABI_MAJOR, DFLASH_ABI_MINOR) +
                          "; rebuild the plugin against dflash-sdk " + std::to_string(DFLASH_ABI_MAJOR) +
                          ".x or use a host of ABI " + std::to_string(major));
        return;
      }
    }
    problem(file, std::string("no entry symbol '") + DFLASH_ENTRY_SYMBOL +
                      "'; not a dflash-host plugin, or the SDK's DFLASH_PLUGINS(...) macro is missing from its sources");
    return;
  }
  auto entry = library.get<const dflash_plugin_library*()>(DFLASH_ENTRY_SYMBOL);
  const dflash_plugin_library* info = nullptr;
  try {
    info = entry();  // must not throw; a library not built with the SDK might
  } catch (...) {
    problem(file, std::string(DFLASH_ENTRY_SYMBOL) + "() threw a C++ exception; the entry must be side-effect free "
                      "and return static data (use the SDK's DFLASH_PLUGINS macro)");
    return;
  }
  if (info == nullptr) {
    problem(file, std::string(DFLASH_ENTRY_SYMBOL) + "() returned NULL; the plugin's entry must return its library descriptor");
    return;
  }
  const size_t minimum = DFLASH_SIZE_THROUGH(dflash_plugin_library, plugins);
  if (info->struct_size < minimum) {
    problem(file, "library descriptor struct_size is " + std::to_string(info->struct_size) +
                      " bytes, smaller than the " + std::to_string(minimum) +
                      " of ABI 1.0; the library was built with a broken SDK, rebuild it with dflash-sdk");
    return;
  }
  if (info->abi_major != DFLASH_ABI_MAJOR) {
    problem(file, "exports " DFLASH_ENTRY_SYMBOL " but declares ABI " + abi_string(info->abi_major, info->abi_minor) +
                      ", while this host speaks ABI " + abi_string(DFLASH_ABI_MAJOR, DFLASH_ABI_MINOR) +
                      "; rebuild the plugin against dflash-sdk " + std::to_string(DFLASH_ABI_MAJOR) + ".x");
    return;
  }
  if (info->abi_minor > DFLASH_ABI_MINOR) {
    problem(file, "built against plugin ABI " + abi_string(info->abi_major, info->abi_minor) +
                      ", newer than this host's ABI " + abi_string(DFLASH_ABI_MAJOR, DFLASH_ABI_MINOR) +
                      "; upgrade dflash-host, or rebuild the plugin against dflash-sdk " +
                      abi_string(DFLASH_ABI_MAJOR, DFLASH_ABI_MINOR));
    return;
  }
  const dflash_torch_build* theirs = info->torch_build;
  if (theirs != nullptr) {
    if (theirs->struct_size < DFLASH_SIZE_THROUGH(dflash_torch_build, cxx11_abi)) {
      problem(file, "LibTorch build record struct_size is " + std::to_string(theirs->struct_size) +
                        " bytes, too small for ABI 1.0; rebuild it with dflash-sdk");
      return;
    }
    const dflash_torch_build* ours = host_torch_build();
    if (!same_text(theirs->torch_version, ours->torch_version) || !same_text(theirs->cuda_version, ours->cuda_version) ||
        theirs->cxx11_abi != ours->cxx11_abi) {
      problem(file, "built against " + describe_torch_build(theirs) + ", but this host uses " +
                        describe_torch_build(ours) +
                        "; rebuild the plugin against the host's LibTorch (the same CMAKE_PREFIX_PATH for Torch)");
      return;
    }
  }
  if (info->plugin_count > 0 && info->plugins == nullptr) {
    problem(file, "declares " + std::to_string(info->plugin_count) + " plugins but a NULL list; rebuild it");
    return;
  }
  if (info->plugin_count == 0) {
    problem(file, "declares no plugins; list the plugin classes in DFLASH_PLUGINS(...)");
    return;
  }
  for (size_t i = 0; i < info->plugin_count; ++i) {
    PluginRecord record;
    record.file = file;
    record.abi_major = info->abi_major;
    record.abi_minor = info->abi_minor;
    record.torch_build = describe_torch_build(theirs);
    const std::string wrong = check_descriptor(info->plugins[i], record);
    if (!wrong.empty()) {
      problem(file, wrong);
      continue;
    }
    add_plugin(std::move(record));
  }
}

void PluginRegistry::add_plugin(PluginRecord record) {
  const auto key = std::make_pair(static_cast<int32_t>(record.kind), record.name);
  auto report_duplicate = [&](const fs::path& other) {
    problem(record.file, "duplicate " + std::string(kind_display(record.kind)) + " plugin '" + record.name +
                             "', also defined in " + other.string() +
                             "; remove one of the two files (or rename one plugin)");
  };
  auto dup = duplicates_.find(key);
  if (dup != duplicates_.end()) {
    dup->second.push_back(record.file);
    report_duplicate(dup->second.front());
    return;
  }
  for (auto it = plugins_.begin(); it != plugins_.end(); ++it) {
    if (it->kind == record.kind && it->name == record.name) {
      // Neither wins: a silent choice between two implementations would make
      // runs depend on directory order.
      duplicates_[key] = {it->file, record.file};
      report_duplicate(it->file);
      plugins_.erase(it);
      return;
    }
  }
  log::debug("loaded " + record.label() + " version " + record.version);
  plugins_.push_back(std::move(record));
}

const PluginRecord& PluginRegistry::find(dflash_kind kind, const std::string& name) const {
  for (const PluginRecord& record : plugins_)
    if (record.kind == kind && record.name == name) return record;
  auto dup = duplicates_.find(std::make_pair(static_cast<int32_t>(kind), name));
  if (dup != duplicates_.end()) {
    std::string files;
    for (const auto& file : dup->second) files += (files.empty() ? "" : " and ") + file.string();
    throw PluginLookupError(std::string(kind_display(kind)) + " plugin '" + name + "' is defined twice, in " + files +
                            "; remove one of them");
  }
  std::string available;
  for (const PluginRecord& record : plugins_)
    if (record.kind == kind) available += (available.empty() ? "" : ", ") + record.name + " (" + record.file.filename().string() + ")";
  std::string dirs;
  for (const auto& dir : directories_) dirs += (dirs.empty() ? "" : ", ") + dir.string();
  std::ostringstream message;
  message << "no " << kind_display(kind) << " plugin named '" << name << "'; available " << kind_display(kind)
          << " plugins: " << (available.empty() ? "none" : available) << "; searched: " << (dirs.empty() ? "no directories" : dirs)
          << " (add one with --plugin-dir)";
  if (!problems_.empty()) message << "; " << problems_.size() << " libraries were skipped, see `dflash-host list`";
  throw PluginLookupError(message.str());
}

std::vector<const PluginRecord*> PluginRegistry::find_any_kind(const std::string& name) const {
  std::vector<const PluginRecord*> found;
  for (const PluginRecord& record : plugins_)
    if (record.name == name) found.push_back(&record);
  return found;
}

}  // namespace dflash::host
