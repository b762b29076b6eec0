// The host's side of the C ABI: the function table handed to plugins, the
// concrete types behind the opaque handles, and C++ helpers over them.
#pragma once

#include <dflash/abi.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

// The opaque ABI types, defined here and nowhere else.
struct dflash_error {
  int32_t code;
  std::string message;
};
struct dflash_tensor {
  at::Tensor tensor;
};
struct dflash_tensor_map {
  std::vector<std::pair<std::string, std::unique_ptr<dflash_tensor>>> entries;
};
// What one plugin's plan_memory call reported (ABI 1.2).
struct dflash_memory_plan {
  struct Item {
    std::string category;
    uint64_t bytes;
    int32_t phase;  // dflash_memory_phase
  };
  std::vector<Item> items;
  std::string facts_json = "{}";  // a JSON object, merged from every plan_set_facts
};

namespace dflash::host {

// The table every plugin instance receives; lives for the whole process.
const dflash_host_api* host_api();

// The LibTorch this host was compiled against.
const dflash_torch_build* host_torch_build();

// Owns an error returned by a plugin.
void release_error(dflash_error* error);
struct ErrorDeleter {
  void operator()(dflash_error* error) const { release_error(error); }
};
using ErrorPtr = std::unique_ptr<dflash_error, ErrorDeleter>;

const char* error_code_name(int32_t code);

// Handle helpers for host code.
inline dflash_tensor* new_handle(at::Tensor tensor) { return new dflash_tensor{std::move(tensor)}; }
struct TensorHandleDeleter {
  void operator()(dflash_tensor* handle) const { delete handle; }
};
using TensorHandle = std::unique_ptr<dflash_tensor, TensorHandleDeleter>;

// A named set of tensors the host owns; converts to and from the ABI map.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
std::unique_ptr<dflash_tensor_map> to_map(const NamedTensors& tensors);
NamedTensors from_map(const dflash_tensor_map& map);
// The tensor named `name`, or an undefined tensor when there is none.
at::Tensor find_tensor(const NamedTensors& tensors, const std::string& name);
// The same, or std::runtime_error "<who> returned no '<name>'".
at::Tensor require_tensor(const NamedTensors& tensors, const std::string& name, const std::string& who);

// DLPack <-> at::Tensor (also reachable through the table).
at::Tensor tensor_from_dlpack(dflash_dl_managed_tensor* source);  // takes ownership; throws
dflash_dl_managed_tensor* tensor_to_dlpack(const at::Tensor& tensor);  // throws

}  // namespace dflash::host
