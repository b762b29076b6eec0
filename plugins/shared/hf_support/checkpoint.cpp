#include "checkpoint.h"

#include <dflash/sdk/safetensors_torch.hpp>

#include <nlohmann/json.hpp>

#include <fstream>
#include <stdexcept>

namespace dflash::hf {
namespace fs = std::filesystem;
namespace st = sdk::safetensors;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

Checkpoint::Checkpoint(const fs::path& dir) : dir_(dir) {
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(index.string() + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw std::runtime_error(index.string() + ": weight_map: missing");
    std::map<std::string, std::shared_ptr<st::File>> shards;
    for (auto& [name, shard] : j["weight_map"].items()) {
      if (!shard.is_string()) throw std::runtime_error(index.string() + ": weight_map." + name + ": must be a file name");
      const std::string file = shard.get<std::string>();
      if (file.find('/') != std::string::npos || file == "..")
        throw std::runtime_error(index.string() + ": weight_map." + name + ": shard '" + file +
                                 "' must be a file name in the model directory");
      if (!shards.count(file)) shards[file] = st::File::open(dir / file);
      if (!shards[file]->find(name))
        throw std::runtime_error((dir / file).string() + ": tensor '" + name + "' is listed in " +
                                 index.filename().string() + " but missing from the shard");
      where_[name] = shards[file];
    }
  } else if (fs::exists(single)) {
    auto file = st::File::open(single);
    for (const auto& t : file->tensors()) where_[t.name] = file;
  } else {
    throw std::runtime_error(dir.string() + ": no model.safetensors or model.safetensors.index.json");
  }
}

std::optional<std::vector<int64_t>> Checkpoint::shape(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return std::nullopt;
  const st::TensorInfo* info = it->second->find(name);
  return info->shape;
}

at::Tensor Checkpoint::get(const std::string& name, const std::vector<int64_t>& shape, c10::ScalarType dtype,
                           const c10::Device& device) const {
  auto it = where_.find(name);
  if (it == where_.end())
    throw std::runtime_error(dir_.string() + ": tensor '" + name + "' is missing from the checkpoint (" +
                             std::to_string(where_.size()) + " tensors present)");
  at::Tensor t = st::load_tensor(it->second, name);
  if (t.sizes().vec() != shape)
    throw std::runtime_error(it->second->path().string() + ": tensor '" + name + "' has shape " +
                             shape_string(t.sizes().vec()) + ", config.json implies " + shape_string(shape));
  if (!at::isFloatingType(t.scalar_type()))
    throw std::runtime_error(it->second->path().string() + ": tensor '" + name + "' is not floating point");
  return t.to(device, dtype).contiguous();
}

std::vector<std::string> Checkpoint::names_with_prefix(const std::string& prefix) const {
  std::vector<std::string> names;
  for (auto it = where_.lower_bound(prefix); it != where_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    names.push_back(it->first);
  return names;
}

}  // namespace dflash::hf
