#include "checkpoint/checkpoint.h"

#include "hash/file_hash.h"
#include "log/log.h"

#include <dflash/sdk/safetensors_torch.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace dflash::checkpoint {
namespace st = sdk::safetensors;
namespace {

// The files of a checkpoint folder. trainer_state.json is written last and
// records the size and checksum of the others.
const char* const kDataFiles[] = {"config.json", "model.safetensors", "optimizer.safetensors"};
const char* const kStateFile = "trainer_state.json";

std::runtime_error io_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what + " (" + std::strerror(errno) + ")");
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Makes a file's contents (or a directory's entries) durable.
void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw io_error(path, "cannot open to sync");
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  errno = error;
  // Directories on some filesystems refuse fsync (EINVAL); their renames are
  // then as durable as that filesystem makes them.
  if (result != 0 && errno != EINVAL) throw io_error(path, "cannot sync to disk");
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw io_error(tmp, "cannot write");
  }
  fsync_path(tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw io_error(path, "cannot rename into place");
}

void remove_tree(const std::string& path) {
  if (DIR* dir = ::opendir(path.c_str())) {
    while (const dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string child = path + "/" + name;
      if (is_directory(child)) remove_tree(child);
      else ::unlink(child.c_str());
    }
    ::closedir(dir);
  }
  ::rmdir(path.c_str());
}

std::vector<std::string> entries(const std::string& root, const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* dir = ::opendir(root.c_str())) {
    while (const dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name.rfind(prefix, 0) == 0) out.push_back(name);
    }
    ::closedir(dir);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// step-* folder names, oldest first (by step number, not by spelling).
std::vector<std::string> step_folders(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& name : entries(root, "step-"))
    if (auto step = step_of(name); step && is_directory(root + "/" + name)) found.emplace_back(*step, name);
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, name] : found) out.push_back(std::move(name));
  return out;
}

// Deletes a folder without ever leaving it half deleted under its own name:
// it is renamed to .trash-NAME first (a leftover the next save clears).
void discard(const std::string& root, const std::string& name) {
  const std::string trash = root + "/.trash-" + name;
  if (exists(trash)) remove_tree(trash);
  if (::rename((root + "/" + name).c_str(), trash.c_str()) != 0) throw io_error(root + "/" + name, "cannot move aside");
  fsync_path(root);
  remove_tree(trash);
}

void clear_leftovers(const std::string& root) {
  for (const char* prefix : {".tmp-", ".old-", ".trash-"})
    for (const auto& name : entries(root, prefix)) remove_tree(root + "/" + name);
}

// Puts the finished folder `tmp` in place as `final_dir`. When final_dir
// exists (the same step saved again) the two are exchanged atomically, so
// a crash leaves one whole version under the name; where the filesystem
// cannot exchange, the old one is renamed to .old-NAME first (resume_folder
// recovers from a crash between the two renames).
void put_in_place(const std::string& root, const std::string& tmp, const std::string& name) {
  const std::string final_dir = root + "/" + name;
  if (exists(final_dir)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) return;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      throw io_error(final_dir, "cannot swap the new checkpoint in");
    const std::string old = root + "/.old-" + name;
    if (exists(old)) remove_tree(old);
    if (::rename(final_dir.c_str(), old.c_str()) != 0) throw io_error(final_dir, "cannot move the previous copy aside");
    fsync_path(root);
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) throw io_error(final_dir, "cannot rename the checkpoint into place");
}

host::NamedTensors read_all(const std::string& path) {
  auto file = st::File::open(path);
  host::NamedTensors out;
  for (const auto& info : file->tensors()) out.emplace_back(info.name, st::load_tensor(file, info).clone());
  return out;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw io_error(path, "cannot read");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON (" + e.what() + ")");
  }
}

bool complete(const std::string& dir) {
  if (!is_directory(dir) || !is_regular_file(dir + "/" + kStateFile)) return false;
  for (const char* file : kDataFiles)
    if (!is_regular_file(dir + "/" + file)) return false;
  return true;
}

std::string missing_files(const std::string& dir) {
  std::string missing;
  for (const char* file : {kDataFiles[0], kDataFiles[1], kDataFiles[2], kStateFile})
    if (!is_regular_file(dir + "/" + file)) missing += (missing.empty() ? "" : ", ") + std::string(file);
  return missing;
}

std::string parent_of(const std::string& dir) {
  const size_t slash = dir.find_last_of('/');
  return slash == std::string::npos ? "." : dir.substr(0, slash);
}

std::string base_name(const std::string& dir) {
  const size_t slash = dir.find_last_of('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

// What to do about a damaged or missing checkpoint: the newest intact one.
std::string how_to_continue(const std::string& root, const std::string& except) {
  for (const auto& name : intact_checkpoints(root))
    if (name != except) return "the newest intact checkpoint is " + name + ": resume from it with --resume-from " + name;
  return "no intact checkpoint is left in " + root + ": move it aside to start the run over";
}

void require_finite(const host::NamedTensors& tensors, const std::string& file) {
  for (const auto& [name, tensor] : tensors)
    if (at::isFloatingType(tensor.scalar_type()) && !at::isfinite(tensor).all().item<bool>())
      throw DamagedCheckpoint(file + ": tensor '" + name + "' holds NaN or Inf values; a checkpoint is written only "
                              "from finite weights, so this file was damaged after it was written");
}

}  // namespace

void write_file_whole(const std::string& path, const std::string& text) { write_text(path, text); }

std::string json_text(const nlohmann::json& value, int indent) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string step_name(int64_t step) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "step-%08lld", static_cast<long long>(step));
  return buffer;
}

std::optional<int64_t> step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() < 6 || name.size() > 5 + 18) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

void make_directories(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!partial.empty() && ::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) throw io_error(partial, "cannot create");
    }
    if (i < path.size()) partial += path[i];
  }
}

void check_writable(const std::string& root) {
  make_directories(root);
  if (!is_directory(root)) {
    errno = ENOTDIR;
    throw io_error(root, "cannot hold checkpoints");
  }
  const std::string probe = root + "/.write-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error(root, "cannot write checkpoints there");
  const bool written = ::write(fd, "x", 1) == 1 && ::fsync(fd) == 0;
  const int error = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!written) {
    errno = error;
    throw io_error(root, "cannot write checkpoints there");
  }
}

std::string save(const std::string& root, int64_t step, const nlohmann::json& drafter_config,
                 const host::NamedTensors& weights, const host::NamedTensors& optimizer,
                 const nlohmann::json& trainer_state, int64_t keep) {
  make_directories(root);
  clear_leftovers(root);  // a crash's leftovers
  const std::string name = step_name(step), tmp = root + "/.tmp-" + name;
  make_directories(tmp);
  nlohmann::json config = drafter_config;
  const auto floating = std::find_if(weights.begin(), weights.end(),
                                     [](const auto& entry) { return at::isFloatingType(entry.second.scalar_type()); });
  if (floating != weights.end()) {
    // The weights' dtype under both names: transformers 5 reads "dtype",
    // earlier versions "torch_dtype" (a drafter's integer buffers, such as a
    // draft vocabulary's maps, say nothing of it).
    const auto type = floating->second.scalar_type();
    config["dtype"] = type == at::kBFloat16 ? "bfloat16" : type == at::kHalf ? "float16" : "float32";
    config["torch_dtype"] = config["dtype"];
  }
  write_text(tmp + "/config.json", json_text(config, 2) + "\n");
  st::save_tensors(tmp + "/model.safetensors", weights, {{"format", "pt"}});
  fsync_path(tmp + "/model.safetensors");
  // Fault injection for the crash test: DFLASH_FAULT_ABORT_IN_SAVE=N kills the
  // process in the middle of this process's N-th checkpoint.
  static int saves = 0;
  if (const char* n = std::getenv("DFLASH_FAULT_ABORT_IN_SAVE"); n != nullptr && ++saves == std::atoi(n)) std::abort();
  st::save_tensors(tmp + "/optimizer.safetensors", optimizer, {{"format", "pt"}});
  fsync_path(tmp + "/optimizer.safetensors");
  nlohmann::json state = trainer_state;
  state["files"] = nlohmann::json::object();
  for (const char* file : kDataFiles) {
    const hash::FileDigest digest = hash::digest_file(tmp + "/" + file);
    state["files"][file] = {{"bytes", digest.bytes}, {"xxh64", digest.xxh64}};
  }
  write_text(tmp + "/" + kStateFile, json_text(state, 2) + "\n");
  fsync_path(tmp);
  put_in_place(root, tmp, name);
  fsync_path(root);
  write_text(root + "/latest", name + "\n");
  fsync_path(root);
  clear_leftovers(root);  // the replaced copy of a step saved again
  const auto all = step_folders(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i)
    if (all[i] != name) discard(root, all[i]);
  return root + "/" + name;
}

std::string verify(const std::string& dir) {
  if (!complete(dir)) return dir + ": incomplete checkpoint (missing " + missing_files(dir) + ")";
  nlohmann::json state;
  try {
    state = read_json(dir + "/" + kStateFile);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (!state.is_object()) return dir + "/" + kStateFile + ": not a JSON object";
  if (!state.contains("files")) return "";  // written before checksums were recorded; load() warns
  const nlohmann::json& files = state.at("files");
  for (const char* file : kDataFiles) {
    const std::string path = dir + "/" + file;
    if (!files.is_object() || !files.contains(file) || !files[file].is_object() ||
        !files[file].contains("bytes") || !files[file]["bytes"].is_number_unsigned() ||
        !files[file].contains("xxh64") || !files[file]["xxh64"].is_string())
      return dir + "/" + kStateFile + ": files." + file + " is missing or malformed (expected {\"bytes\": N, \"xxh64\": \"…\"})";
    const hash::FileDigest digest = hash::digest_file(path);
    const uint64_t bytes = files[file]["bytes"].get<uint64_t>();
    if (digest.bytes != bytes)
      return path + ": " + std::to_string(digest.bytes) + " bytes, but the checkpoint recorded " + std::to_string(bytes) +
             " (the file was truncated or changed after it was written)";
    if (digest.xxh64 != files[file]["xxh64"].get<std::string>())
      return path + ": checksum XXH64 " + digest.xxh64 + ", but the checkpoint recorded " +
             files[file]["xxh64"].get<std::string>() + " (the file was damaged after it was written)";
  }
  return "";
}

std::vector<std::string> intact_checkpoints(const std::string& root) {
  std::vector<std::string> out;
  auto all = step_folders(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (verify(root + "/" + *it).empty()) out.push_back(*it);
  return out;
}

Checkpoint load(const std::string& dir) {
  const std::string root = parent_of(dir), name = base_name(dir);
  if (const std::string problem = verify(dir); !problem.empty())
    throw DamagedCheckpoint(problem + "; " + how_to_continue(root, name));
  Checkpoint c;
  c.dir = dir;
  c.trainer_state = read_json(dir + "/" + kStateFile);
  if (!c.trainer_state.contains("files"))
    log::warn(dir + ": no checksums recorded (written by an older dflash-host); its files are not verified");
  try {
    c.weights = read_all(dir + "/model.safetensors");
    c.optimizer = read_all(dir + "/optimizer.safetensors");
    require_finite(c.weights, dir + "/model.safetensors");
    require_finite(c.optimizer, dir + "/optimizer.safetensors");
  } catch (const DamagedCheckpoint& e) {
    throw DamagedCheckpoint(std::string(e.what()) + "; " + how_to_continue(root, name));
  }
  return c;
}

std::optional<std::string> resume_folder(const std::string& root) {
  if (!is_directory(root)) return std::nullopt;
  const std::string latest = root + "/latest";
  if (!exists(latest)) {
    const auto steps = step_folders(root);
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (!complete(root + "/" + *it)) continue;
      write_text(latest, *it + "\n");
      fsync_path(root);
      log::warn(latest + " was missing beside checkpoint folders; it now names the newest complete one, " + *it +
                " (recovered)");
      return root + "/" + *it;
    }
    return std::nullopt;  // nothing whole was ever put in place
  }
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw std::runtime_error(latest + ": does not name a checkpoint folder (holds '" + name + "'); " +
                             how_to_continue(root, ""));
  const std::string dir = root + "/" + name;
  if (complete(dir)) return dir;
  // A save cut off between moving the old copy aside and renaming the new
  // one in leaves both whole under temporary names; the new one wins.
  for (const std::string& alternative : {".tmp-" + name, ".old-" + name}) {
    const std::string candidate = root + "/" + alternative;
    if (!complete(candidate) || !verify(candidate).empty()) continue;
    if (exists(dir)) discard(root, name);
    if (::rename(candidate.c_str(), dir.c_str()) != 0) throw io_error(dir, "cannot restore the interrupted checkpoint");
    fsync_path(root);
    log::warn(latest + " named " + name + ", whose save was interrupted; restored it from " + alternative);
    return dir;
  }
  throw DamagedCheckpoint(latest + ": names " + name + ", which is " + (exists(dir) ? "incomplete (missing " +
                          missing_files(dir) + ")" : std::string("missing")) + "; " + how_to_continue(root, name));
}

std::optional<Checkpoint> load_latest(const std::string& root) {
  const auto dir = resume_folder(root);
  if (!dir) return std::nullopt;
  return load(*dir);
}

std::vector<std::string> resume_from(const std::string& root, int64_t step) {
  const std::string name = step_name(step);
  if (!complete(root + "/" + name)) {
    const auto intact = intact_checkpoints(root);
    std::string list;
    for (const auto& n : intact) list += (list.empty() ? "" : ", ") + n;
    throw std::invalid_argument("--resume-from " + name + ": " + root + "/" + name + " is not a complete checkpoint; " +
                                (intact.empty() ? "there is no intact one" : "intact ones: " + list));
  }
  std::vector<std::string> set_aside;
  for (const auto& newer : step_folders(root)) {
    if (*step_of(newer) <= step) continue;
    std::string target = "abandoned-" + newer;
    for (int k = 2; exists(root + "/" + target); ++k) target = "abandoned-" + newer + "-" + std::to_string(k);
    if (::rename((root + "/" + newer).c_str(), (root + "/" + target).c_str()) != 0) throw io_error(root + "/" + newer, "cannot move aside");
    set_aside.push_back(target);
  }
  fsync_path(root);
  write_text(root + "/latest", name + "\n");
  fsync_path(root);
  return set_aside;
}

std::optional<TensorMismatch> first_mismatch(const std::map<std::string, at::Tensor>& saved,
                                             const host::NamedTensors& into, bool exact_dtype) {
  for (const auto& [name, tensor] : into) {
    const auto found = saved.find(name);
    if (found == saved.end()) return TensorMismatch{TensorMismatch::Kind::kMissing, name, at::Tensor(), tensor};
    if (found->second.sizes() != tensor.sizes())
      return TensorMismatch{TensorMismatch::Kind::kShape, name, found->second, tensor};
    if (exact_dtype && found->second.scalar_type() != tensor.scalar_type())
      return TensorMismatch{TensorMismatch::Kind::kDtype, name, found->second, tensor};
  }
  return std::nullopt;
}

void copy_saved(const std::map<std::string, at::Tensor>& saved, const host::NamedTensors& into) {
  const c10::NoGradGuard no_grad;
  for (const auto& [name, tensor] : into) tensor.copy_(saved.at(name));
}

DrafterDirectory load_drafter(const std::string& path) {
  std::string dir = path;
  for (const std::string root : {path + "/checkpoints", path}) {
    if (is_regular_file(dir + "/model.safetensors")) break;
    std::ifstream latest(root + "/latest");
    if (!latest) continue;
    std::string name;
    std::getline(latest, name);
    if (name.empty() || name.find('/') != std::string::npos)
      throw std::runtime_error(root + "/latest: does not name a checkpoint folder (holds '" + name + "')");
    dir = root + "/" + name;
    break;
  }
  if (!is_regular_file(dir + "/model.safetensors") || !is_regular_file(dir + "/config.json"))
    throw std::runtime_error(path + ": not a drafter directory (config.json + model.safetensors), a checkpoint root with "
                                    "`latest`, or a run directory with checkpoints/latest");
  return {dir, read_json(dir + "/config.json"), read_all(dir + "/model.safetensors")};
}

}  // namespace dflash::checkpoint
