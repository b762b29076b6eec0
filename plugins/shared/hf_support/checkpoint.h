// A Hugging Face model directory's tensors: model.safetensors, or the shards
// that model.safetensors.index.json names. Every problem is reported with
// the file and the tensor. Reading maps the files; a tensor is read (and
// converted to the dtype and device asked for) only when get() asks for it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dflash::sdk::safetensors {
class File;
}

namespace dflash::hf {

class Checkpoint {
 public:
  // Throws std::runtime_error naming the directory, the index or the shard.
  explicit Checkpoint(const std::filesystem::path& dir);

  bool has(const std::string& name) const { return where_.count(name) > 0; }
  // The tensor's shape from its file's header (nothing is read); nullopt
  // when the checkpoint has no such tensor.
  std::optional<std::vector<int64_t>> shape(const std::string& name) const;
  // The tensor, converted to dtype/device, checked against `shape` (the
  // shape config.json implies): an error names the file, the tensor and both
  // shapes. A missing tensor's error names the tensor and what asked for it.
  at::Tensor get(const std::string& name, const std::vector<int64_t>& shape, c10::ScalarType dtype,
                 const c10::Device& device) const;
  // Every tensor name starting with `prefix`.
  std::vector<std::string> names_with_prefix(const std::string& prefix) const;
  const std::filesystem::path& directory() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::map<std::string, std::shared_ptr<sdk::safetensors::File>> where_;
};

// "[a, b, c]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace dflash::hf
