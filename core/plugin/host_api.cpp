#include "plugin/host_api.h"

#include "log/log.h"

#include <dflash/sdk/torch.hpp>  // the SDK's record of the LibTorch build, shared with plugins

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <new>
#include <stdexcept>

namespace dflash::host {
namespace {

// Returned when even an error cannot be allocated; never freed.
dflash_error g_error_oom{DFLASH_ERR_OUT_OF_MEMORY, "out of memory while reporting an error"};

dflash_error* make_error(int32_t code, const char* message) {
  try {
    return new dflash_error{code, message ? message : ""};
  } catch (...) {
    return &g_error_oom;
  }
}

void free_error(dflash_error* error) { release_error(error); }

int32_t error_code_of(const dflash_error* error) { return error ? error->code : 0; }
const char* error_message_of(const dflash_error* error) { return error ? error->message.c_str() : ""; }

void plugin_log(int32_t level, const char* plugin_name, const char* message) {
  log::plugin_message(level, plugin_name ? plugin_name : "?", message ? message : "");
}

void tensor_free(dflash_tensor* tensor) { delete tensor; }

dflash_tensor* tensor_share(const dflash_tensor* tensor) {
  if (tensor == nullptr) return nullptr;
  try {
    return new dflash_tensor{tensor->tensor};
  } catch (...) {
    return nullptr;
  }
}

dflash_error* from_dlpack_c(dflash_dl_managed_tensor* source, dflash_tensor** out) {
  try {
    if (out == nullptr) throw std::invalid_argument("tensor_from_dlpack: out is NULL");
    *out = new dflash_tensor{tensor_from_dlpack(source)};
    return nullptr;
  } catch (const std::exception& e) {
    return make_error(DFLASH_ERR_INVALID_ARGUMENT, e.what());
  }
}

dflash_error* to_dlpack_c(const dflash_tensor* tensor, dflash_dl_managed_tensor** out) {
  try {
    if (tensor == nullptr || out == nullptr) throw std::invalid_argument("tensor_to_dlpack: NULL argument");
    *out = tensor_to_dlpack(tensor->tensor);
    return nullptr;
  } catch (const std::exception& e) {
    return make_error(DFLASH_ERR_INVALID_ARGUMENT, e.what());
  }
}

const void* tensor_torch_ref(const dflash_tensor* tensor) { return tensor ? &tensor->tensor : nullptr; }

dflash_tensor* tensor_from_torch(const void* at_tensor) {
  if (at_tensor == nullptr) return nullptr;
  try {
    return new dflash_tensor{*static_cast<const at::Tensor*>(at_tensor)};
  } catch (...) {
    return nullptr;
  }
}

dflash_error* map_set(dflash_tensor_map* map, const char* name, dflash_tensor* tensor) {
  std::unique_ptr<dflash_tensor> owned(tensor);  // owned whatever happens
  if (map == nullptr || name == nullptr || *name == '\0')
    return make_error(DFLASH_ERR_INVALID_ARGUMENT, "map_set: NULL map or empty name");
  if (!owned) return make_error(DFLASH_ERR_INVALID_ARGUMENT, std::string("map_set: NULL tensor for '").append(name).append("'").c_str());
  try {
    for (auto& entry : map->entries) {
      if (entry.first == name) {
        entry.second = std::move(owned);
        return nullptr;
      }
    }
    map->entries.emplace_back(name, std::move(owned));
    return nullptr;
  } catch (const std::bad_alloc&) {
    return make_error(DFLASH_ERR_OUT_OF_MEMORY, "map_set: out of memory");
  }
}

const dflash_tensor* map_get(const dflash_tensor_map* map, const char* name) {
  if (map == nullptr || name == nullptr) return nullptr;
  for (const auto& entry : map->entries)
    if (entry.first == name) return entry.second.get();
  return nullptr;
}
size_t map_size(const dflash_tensor_map* map) { return map ? map->entries.size() : 0; }
const char* map_name_at(const dflash_tensor_map* map, size_t i) {
  return map && i < map->entries.size() ? map->entries[i].first.c_str() : nullptr;
}
const dflash_tensor* map_tensor_at(const dflash_tensor_map* map, size_t i) {
  return map && i < map->entries.size() ? map->entries[i].second.get() : nullptr;
}

dflash_error* plan_add(dflash_memory_plan* plan, const char* category, uint64_t bytes, int32_t phase) {
  if (plan == nullptr || category == nullptr)
    return make_error(DFLASH_ERR_INVALID_ARGUMENT, "plan_add: plan and category must not be NULL");
  if (phase < DFLASH_MEMORY_RESIDENT || phase > DFLASH_MEMORY_BACKWARD)
    return make_error(DFLASH_ERR_INVALID_ARGUMENT, ("plan_add: '" + std::string(category) + "' has unknown phase " +
                                                    std::to_string(phase) + " (dflash_memory_phase: 1…4)").c_str());
  try {
    plan->items.push_back({category, bytes, phase});
  } catch (...) {
    return make_error(DFLASH_ERR_OUT_OF_MEMORY, "plan_add: out of host memory");
  }
  return nullptr;
}

dflash_error* plan_set_facts(dflash_memory_plan* plan, const char* facts_json) {
  if (plan == nullptr || facts_json == nullptr)
    return make_error(DFLASH_ERR_INVALID_ARGUMENT, "plan_set_facts: plan and facts must not be NULL");
  try {
    nlohmann::json facts = nlohmann::json::parse(plan->facts_json);
    const nlohmann::json update = nlohmann::json::parse(facts_json);
    if (!update.is_object()) return make_error(DFLASH_ERR_INVALID_ARGUMENT, "plan_set_facts: the facts must be a JSON object");
    facts.update(update);
    plan->facts_json = facts.dump();
  } catch (const std::exception& e) {
    return make_error(DFLASH_ERR_INVALID_ARGUMENT, (std::string("plan_set_facts: not JSON: ") + e.what()).c_str());
  }
  return nullptr;
}

// DLPack type codes (the DLPack spec's values).
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6;
constexpr int32_t kDLCPU = 1, kDLCUDA = 2;

c10::ScalarType scalar_type_of(const dflash_dl_dtype& t) {
  if (t.lanes != 1) throw std::invalid_argument("DLPack tensor with lanes != 1 is not supported");
  switch (t.code) {
    case kDLInt:
      if (t.bits == 8) return c10::ScalarType::Char;
      if (t.bits == 16) return c10::ScalarType::Short;
      if (t.bits == 32) return c10::ScalarType::Int;
      if (t.bits == 64) return c10::ScalarType::Long;
      break;
    case kDLUInt:
      if (t.bits == 8) return c10::ScalarType::Byte;
      break;
    case kDLFloat:
      if (t.bits == 16) return c10::ScalarType::Half;
      if (t.bits == 32) return c10::ScalarType::Float;
      if (t.bits == 64) return c10::ScalarType::Double;
      break;
    case kDLBfloat:
      if (t.bits == 16) return c10::ScalarType::BFloat16;
      break;
    case kDLBool:
      if (t.bits == 8) return c10::ScalarType::Bool;
      break;
  }
  throw std::invalid_argument("unsupported DLPack dtype (code " + std::to_string(t.code) + ", bits " +
                              std::to_string(t.bits) + ")");
}

dflash_dl_dtype dl_dtype_of(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Char: return {kDLInt, 8, 1};
    case c10::ScalarType::Short: return {kDLInt, 16, 1};
    case c10::ScalarType::Int: return {kDLInt, 32, 1};
    case c10::ScalarType::Long: return {kDLInt, 64, 1};
    case c10::ScalarType::Byte: return {kDLUInt, 8, 1};
    case c10::ScalarType::Half: return {kDLFloat, 16, 1};
    case c10::ScalarType::Float: return {kDLFloat, 32, 1};
    case c10::ScalarType::Double: return {kDLFloat, 64, 1};
    case c10::ScalarType::BFloat16: return {kDLBfloat, 16, 1};
    case c10::ScalarType::Bool: return {kDLBool, 8, 1};
    default: throw std::invalid_argument(std::string("dtype ") + c10::toString(type) + " has no DLPack equivalent");
  }
}

struct DlpackExport {
  dflash_dl_managed_tensor managed{};
  at::Tensor tensor;
  std::vector<int64_t> shape, strides;
};

void delete_export(dflash_dl_managed_tensor* self) {
  delete static_cast<DlpackExport*>(self->manager_ctx);
}

const dflash_host_api kHostApi = {
    sizeof(dflash_host_api),
    DFLASH_ABI_MAJOR,
    DFLASH_ABI_MINOR,
    sdk::detail::this_binary_torch_build(),
    &make_error,
    &error_code_of,
    &error_message_of,
    &free_error,
    &plugin_log,
    &tensor_free,
    &tensor_share,
    &from_dlpack_c,
    &to_dlpack_c,
    &tensor_torch_ref,
    &tensor_from_torch,
    &map_set,
    &map_get,
    &map_size,
    &map_name_at,
    &map_tensor_at,
    &plan_add,
    &plan_set_facts,
};

}  // namespace

void release_error(dflash_error* error) {
  if (error != &g_error_oom) delete error;
}

const dflash_host_api* host_api() { return &kHostApi; }
const dflash_torch_build* host_torch_build() { return sdk::detail::this_binary_torch_build(); }

const char* error_code_name(int32_t code) {
  switch (code) {
    case DFLASH_ERR_INVALID_ARGUMENT: return "invalid argument";
    case DFLASH_ERR_INVALID_CONFIG: return "invalid config";
    case DFLASH_ERR_NOT_FOUND: return "not found";
    case DFLASH_ERR_OUT_OF_MEMORY: return "out of memory";
    case DFLASH_ERR_IO: return "I/O error";
    case DFLASH_ERR_DATA: return "bad data";
    case DFLASH_ERR_UNIMPLEMENTED: return "unimplemented";
    case DFLASH_ERR_INTERNAL: return "internal error";
    default: return "unknown error code";
  }
}

std::unique_ptr<dflash_tensor_map> to_map(const NamedTensors& tensors) {
  auto map = std::make_unique<dflash_tensor_map>();
  for (const auto& [name, tensor] : tensors) map->entries.emplace_back(name, std::make_unique<dflash_tensor>(dflash_tensor{tensor}));
  return map;
}

NamedTensors from_map(const dflash_tensor_map& map) {
  NamedTensors out;
  out.reserve(map.entries.size());
  for (const auto& entry : map.entries) out.emplace_back(entry.first, entry.second->tensor);
  return out;
}

at::Tensor find_tensor(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [key, tensor] : tensors)
    if (key == name) return tensor;
  return at::Tensor();
}

at::Tensor require_tensor(const NamedTensors& tensors, const std::string& name, const std::string& who) {
  at::Tensor t = find_tensor(tensors, name);
  if (!t.defined()) throw std::runtime_error(who + " returned no '" + name + "'");
  return t;
}

at::Tensor tensor_from_dlpack(dflash_dl_managed_tensor* source) {
  if (source == nullptr) throw std::invalid_argument("tensor_from_dlpack: source is NULL");
  // Whatever happens below, the producer's deleter runs exactly once.
  auto release = [source](void*) {
    if (source->deleter) source->deleter(source);
  };
  std::unique_ptr<void, decltype(release)> guard(source, release);
  if (source->version.major != 1)
    throw std::invalid_argument("DLPack major version " + std::to_string(source->version.major) + " (expected 1)");
  const dflash_dl_tensor& dl = source->dl_tensor;
  if (dl.ndim < 0 || (dl.ndim > 0 && dl.shape == nullptr))
    throw std::invalid_argument("DLPack tensor with a bad ndim/shape");
  c10::Device device(c10::DeviceType::CPU);
  if (dl.device.device_type == kDLCUDA) device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(dl.device.device_id));
  else if (dl.device.device_type != kDLCPU)
    throw std::invalid_argument("DLPack device type " + std::to_string(dl.device.device_type) + " is not supported (CPU=1, CUDA=2)");
  std::vector<int64_t> shape(dl.shape, dl.shape + dl.ndim);
  for (int64_t extent : shape)
    if (extent < 0) throw std::invalid_argument("DLPack tensor with a negative extent");
  std::vector<int64_t> strides;
  if (dl.strides != nullptr) strides.assign(dl.strides, dl.strides + dl.ndim);
  else {
    strides.assign(shape.size(), 1);
    for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * std::max<int64_t>(shape[i + 1], 1);
  }
  const auto options = at::TensorOptions().dtype(scalar_type_of(dl.dtype)).device(device);
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  at::Tensor tensor = at::from_blob(data, shape, strides, [source](void*) {
    if (source->deleter) source->deleter(source);
  }, options);
  (void)guard.release();  // the tensor's deleter owns the release now
  return tensor;
}

dflash_dl_managed_tensor* tensor_to_dlpack(const at::Tensor& tensor) {
  if (!tensor.defined()) throw std::invalid_argument("tensor_to_dlpack: undefined tensor");
  if (tensor.requires_grad())
    throw std::invalid_argument("tensor_to_dlpack: the tensor requires grad, and DLPack cannot carry autograd state; pass a handle instead");
  auto exported = std::make_unique<DlpackExport>();
  exported->tensor = tensor;
  exported->shape = tensor.sizes().vec();
  exported->strides = tensor.strides().vec();
  dflash_dl_managed_tensor& m = exported->managed;
  m.version.major = 1;
  m.version.minor = 0;
  m.manager_ctx = exported.get();
  m.deleter = &delete_export;
  m.flags = 0;
  m.dl_tensor.data = tensor.data_ptr();
  m.dl_tensor.device.device_type = tensor.is_cuda() ? kDLCUDA : kDLCPU;
  m.dl_tensor.device.device_id = tensor.is_cuda() ? tensor.device().index() : 0;
  m.dl_tensor.ndim = static_cast<int32_t>(tensor.dim());
  m.dl_tensor.dtype = dl_dtype_of(tensor.scalar_type());
  m.dl_tensor.shape = exported->shape.data();
  m.dl_tensor.strides = exported->strides.data();
  m.dl_tensor.byte_offset = 0;
  return &exported.release()->managed;
}

}  // namespace dflash::host
