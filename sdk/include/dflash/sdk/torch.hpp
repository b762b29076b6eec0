// dflash/sdk/torch.hpp — the LibTorch side of the SDK: tensors across the ABI
// as handles to the host's at::Tensor (autograd survives), named tensor maps,
// and the record of which LibTorch this library was built against.
//
// Only the light ATen core header is included here; include <torch/torch.h>
// (or <ATen/ATen.h>) yourself in the files that run operators.
#pragma once

#include <dflash/sdk/core.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#ifndef DFLASH_TORCH_CUDA_VERSION
#error "DFLASH_TORCH_CUDA_VERSION is not defined. Build plugins with dflash_add_plugin() from find_package(dflash-sdk): it records which LibTorch (CPU or CUDA) the plugin is built against, and the host refuses a plugin built against another."
#endif

#if defined(_GLIBCXX_USE_CXX11_ABI)
#define DFLASH_SDK_CXX11_ABI _GLIBCXX_USE_CXX11_ABI
#else
#define DFLASH_SDK_CXX11_ABI (-1)
#endif

namespace dflash::sdk {

namespace detail {

inline const dflash_torch_build* this_binary_torch_build() noexcept {
  static const dflash_torch_build build = {
      sizeof(dflash_torch_build), TORCH_VERSION, DFLASH_TORCH_CUDA_VERSION, DFLASH_SDK_CXX11_ABI};
  return &build;
}

// Where LibTorch says it raised an error: "checked_cast_variable at
// ./torch/csrc/autograd/VariableTypeManual.cpp:53", from the first line of
// the backtrace its what() carries; empty when there is none.
inline std::string torch_error_origin(const c10::Error& error) {
  const std::string full = error.what();
  const std::string marker = "Exception raised from ";
  const size_t at = full.find(marker);
  if (at == std::string::npos) return "";
  const size_t begin = at + marker.size();
  size_t end = full.find(" (most recent call first)", begin);
  if (end == std::string::npos) end = full.find('\n', begin);
  return full.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// LibTorch's exceptions carry a backtrace in what(): the ABI gets the short
// message and where LibTorch raised it (the guard logs the whole text at
// debug level: --log-level debug). A LibTorch error inside a plugin is the
// plugin's bug or an input it did not check, so it is an internal error;
// invalid input is what a plugin reports itself (sdk::Error). Out of memory
// keeps its own code so the host can explain it.
inline bool translate_torch_exception(const std::exception& e, dflash_error_code* code,
                                      std::string* message) {
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    *code = DFLASH_ERR_OUT_OF_MEMORY;
    *message = oom->what_without_backtrace();
    return true;
  }
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    *code = DFLASH_ERR_INTERNAL;
    std::string text = error->what_without_backtrace();
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    const std::string origin = torch_error_origin(*error);
    *message = "LibTorch error: " + text + (origin.empty() ? "" : " [raised from " + origin + "]") +
               " (--log-level debug logs its backtrace)";
    return true;
  }
  return false;
}

// Glue shared by the kinds that exchange tensors.
struct TorchKind {
  static const dflash_torch_build* torch_build() noexcept { return this_binary_torch_build(); }
  static constexpr ExceptionTranslator translate = &translate_torch_exception;
};

}  // namespace detail

// A borrowed view of a handle's tensor (valid while the handle lives).
inline const at::Tensor& borrow_tensor(const dflash_host_api* host, const dflash_tensor* handle) {
  if (handle == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "a required tensor is missing (null handle)");
  return *static_cast<const at::Tensor*>(host->tensor_torch_ref(handle));
}

// A new handle (owned by whoever receives it) holding a reference to `tensor`.
inline dflash_tensor* new_handle(const dflash_host_api* host, const at::Tensor& tensor) {
  return host->tensor_from_torch(&tensor);
}

// Named tensors, in order: the C++ face of dflash_tensor_map.
class TensorDict {
 public:
  TensorDict() = default;
  TensorDict(std::initializer_list<std::pair<std::string, at::Tensor>> entries) : entries_(entries) {}

  // Throws a specific error naming the missing tensor and those present.
  const at::Tensor& at(const std::string& name) const {
    for (const auto& entry : entries_)
      if (entry.first == name) return entry.second;
    std::string present;
    for (const auto& entry : entries_) present += (present.empty() ? "" : ", ") + entry.first;
    throw Error(DFLASH_ERR_INVALID_ARGUMENT,
                "missing tensor '" + name + "' (present: " + (present.empty() ? "none" : present) + ")");
  }
  // Undefined tensor when absent.
  at::Tensor get(const std::string& name) const {
    for (const auto& entry : entries_)
      if (entry.first == name) return entry.second;
    return at::Tensor();
  }
  bool contains(const std::string& name) const { return get(name).defined(); }
  void set(const std::string& name, at::Tensor tensor) {
    for (auto& entry : entries_)
      if (entry.first == name) { entry.second = std::move(tensor); return; }
    entries_.emplace_back(name, std::move(tensor));
  }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

 private:
  std::vector<std::pair<std::string, at::Tensor>> entries_;
};

inline TensorDict read_map(const dflash_host_api* host, const dflash_tensor_map* map) {
  TensorDict dict;
  if (map == nullptr) return dict;
  const size_t n = host->map_size(map);
  for (size_t i = 0; i < n; ++i)
    dict.set(host->map_name_at(map, i), borrow_tensor(host, host->map_tensor_at(map, i)));
  return dict;
}

inline void write_map(const dflash_host_api* host, dflash_tensor_map* map, const TensorDict& dict) {
  if (map == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "the host passed no output map");
  for (const auto& [name, tensor] : dict) {
    if (!tensor.defined()) throw Error(DFLASH_ERR_INTERNAL, "output tensor '" + name + "' is undefined");
    if (dflash_error* error = host->map_set(map, name.c_str(), new_handle(host, tensor)))
      detail::throw_host_error(host, error, DFLASH_ERR_INTERNAL);
  }
}

// The dtype strings of dflash_create_args.
inline c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32") return c10::ScalarType::Float;
  if (name == "bfloat16") return c10::ScalarType::BFloat16;
  if (name == "float16") return c10::ScalarType::Half;
  if (name == "float64") return c10::ScalarType::Double;
  throw Error(DFLASH_ERR_INVALID_CONFIG,
              "unknown dtype '" + name + "' (expected float32, bfloat16, float16 or float64)");
}

// The device a name means, with its index: "cuda" is the current CUDA
// device, and tensors made there report it as cuda:N. A plugin that compares
// a tensor's device with its own must get the indexed form, or "cuda" and
// "cuda:0" differ (eval on `train.device = "cuda"` once ran the drafter's
// eager path that way, its CUDA graphs never used).
inline c10::Device parse_device(const std::string& name) {
  c10::Device device(c10::kCPU);
  try {
    device = c10::Device(name);
  } catch (const c10::Error&) {
    throw Error(DFLASH_ERR_INVALID_CONFIG, "unknown device '" + name + "' (expected cpu, cuda or cuda:N)");
  }
  if (device.is_cpu() || device.has_index()) return device;
  try {
    return c10::impl::getDeviceGuardImpl(device.type())->getDevice();
  } catch (const c10::Error&) {
    return device;  // no such backend in this build: as named, refused where it is used
  }
}

}  // namespace dflash::sdk
