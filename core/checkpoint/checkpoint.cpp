#include "checkpoint/checkpoint.h"

#include <dflash/sdk/safetensors_torch.hpp>

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

std::runtime_error io_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what + " (" + std::strerror(errno) + ")");
}


void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
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
      struct stat st {};
      if (::lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(child);
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

std::string step_name(int64_t step) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "step-%08lld", static_cast<long long>(step));
  return buffer;
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

}  // namespace

void make_directories(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!partial.empty() && ::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) throw io_error(partial, "cannot create");
    }
    if (i < path.size()) partial += path[i];
  }
}

std::string save(const std::string& root, int64_t step, const nlohmann::json& drafter_config,
                 const host::NamedTensors& weights, const host::NamedTensors& optimizer,
                 const nlohmann::json& trainer_state, int64_t keep) {
  make_directories(root);
  for (const auto& stale : entries(root, ".tmp-")) remove_tree(root + "/" + stale);  // a crash's leftovers
  const std::string name = step_name(step), tmp = root + "/.tmp-" + name, final_dir = root + "/" + name;
  make_directories(tmp);
  nlohmann::json config = drafter_config;
  if (!weights.empty()) {
    const auto type = weights.front().second.scalar_type();
    config["torch_dtype"] = type == at::kBFloat16 ? "bfloat16" : type == at::kHalf ? "float16" : "float32";
  }
  write_text(tmp + "/config.json", config.dump(2) + "\n");
  st::save_tensors(tmp + "/model.safetensors", weights, {{"format", "pt"}});
  // Fault injection for the crash test: DFLASH_FAULT_ABORT_IN_SAVE=N kills the
  // process in the middle of this process's N-th checkpoint.
  static int saves = 0;
  if (const char* n = std::getenv("DFLASH_FAULT_ABORT_IN_SAVE"); n != nullptr && ++saves == std::atoi(n)) std::abort();
  st::save_tensors(tmp + "/optimizer.safetensors", optimizer, {{"format", "pt"}});
  write_text(tmp + "/trainer_state.json", trainer_state.dump(2) + "\n");
  fsync_path(tmp);
  if (::access(final_dir.c_str(), F_OK) == 0) remove_tree(final_dir);  // the same step saved again
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) throw io_error(final_dir, "cannot rename the checkpoint into place");
  fsync_path(root);
  write_text(root + "/latest", name + "\n");
  fsync_path(root);
  const auto all = entries(root, "step-");
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) remove_tree(root + "/" + all[i]);
  return final_dir;
}

Checkpoint load(const std::string& dir) {
  Checkpoint c;
  c.dir = dir;
  c.weights = read_all(dir + "/model.safetensors");
  c.optimizer = read_all(dir + "/optimizer.safetensors");
  c.trainer_state = read_json(dir + "/trainer_state.json");
  return c;
}

DrafterDirectory load_drafter(const std::string& path) {
  auto exists = [](const std::string& p) { return std::ifstream(p).good(); };
  std::string dir = path;
  for (const std::string root : {path + "/checkpoints", path}) {
    if (exists(dir + "/model.safetensors")) break;
    std::ifstream latest(root + "/latest");
    if (!latest) continue;
    std::string name;
    std::getline(latest, name);
    if (name.empty() || name.find('/') != std::string::npos)
      throw std::runtime_error(root + "/latest: does not name a checkpoint folder (holds '" + name + "')");
    dir = root + "/" + name;
    break;
  }
  if (!exists(dir + "/model.safetensors") || !exists(dir + "/config.json"))
    throw std::runtime_error(path + ": not a drafter directory (config.json + model.safetensors), a checkpoint root with "
                                    "`latest`, or a run directory with checkpoints/latest");
  return {dir, read_json(dir + "/config.json"), read_all(dir + "/model.safetensors")};
}

std::optional<Checkpoint> load_latest(const std::string& root) {
  std::ifstream latest(root + "/latest");
  if (!latest) return std::nullopt;
  std::string name;
  std::getline(latest, name);
  if (name.empty() || name.find('/') != std::string::npos)
    throw std::runtime_error(root + "/latest: does not name a checkpoint folder (holds '" + name + "')");
  return load(root + "/" + name);
}

}  // namespace dflash::checkpoint
