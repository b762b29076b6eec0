// dflash/sdk/safetensors_torch.hpp — safetensors <-> at::Tensor.
// Loading is zero-copy where the bytes are aligned for their dtype: the
// tensor aliases the (copy-on-write) mapping and keeps the File alive.
#pragma once

#include <dflash/sdk/safetensors.hpp>
#include <dflash/sdk/torch_compat.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <string>
#include <utility>
#include <vector>

namespace dflash::sdk::safetensors {

inline c10::ScalarType scalar_type_of(DType d, const std::string& what) {
  switch (d) {
    case DType::kF64: return c10::ScalarType::Double;
    case DType::kF32: return c10::ScalarType::Float;
    case DType::kF16: return c10::ScalarType::Half;
    case DType::kBF16: return c10::ScalarType::BFloat16;
    case DType::kI64: return c10::ScalarType::Long;
    case DType::kI32: return c10::ScalarType::Int;
    case DType::kI16: return c10::ScalarType::Short;
    case DType::kI8: return c10::ScalarType::Char;
    case DType::kU8: return c10::ScalarType::Byte;
    case DType::kBool: return c10::ScalarType::Bool;
#if DFLASH_TORCH_AT_LEAST(2, 1)
    case DType::kF8E4M3: return c10::ScalarType::Float8_e4m3fn;
    case DType::kF8E5M2: return c10::ScalarType::Float8_e5m2;
#endif
    default: break;
  }
  throw FormatError(what + ": dtype " + dtype_name(d) + " is not supported by this LibTorch (" TORCH_VERSION ")");
}

inline std::optional<DType> dtype_of(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Double: return DType::kF64;
    case c10::ScalarType::Float: return DType::kF32;
    case c10::ScalarType::Half: return DType::kF16;
    case c10::ScalarType::BFloat16: return DType::kBF16;
    case c10::ScalarType::Long: return DType::kI64;
    case c10::ScalarType::Int: return DType::kI32;
    case c10::ScalarType::Short: return DType::kI16;
    case c10::ScalarType::Char: return DType::kI8;
    case c10::ScalarType::Byte: return DType::kU8;
    case c10::ScalarType::Bool: return DType::kBool;
    default: return std::nullopt;
  }
}

// The tensor `info` of `file`, on the CPU.
inline at::Tensor load_tensor(const std::shared_ptr<File>& file, const TensorInfo& info) {
  const auto type = scalar_type_of(info.dtype, file->path().string() + ": tensor '" + info.name + "'");
  uint8_t* bytes = file->data(info);
  const auto options = at::TensorOptions().dtype(type);
  if (reinterpret_cast<uintptr_t>(bytes) % dtype_bytes(info.dtype) != 0) {
    // Unaligned for its dtype (a header not padded to 8 bytes): copy once.
    at::Tensor copy = at::empty(info.shape, options);
    std::memcpy(copy.data_ptr(), bytes, info.end - info.begin);
    return copy;
  }
  std::shared_ptr<File> keep = file;
  return at::from_blob(bytes, info.shape, [keep](void*) mutable { keep.reset(); }, options);
}

inline at::Tensor load_tensor(const std::shared_ptr<File>& file, const std::string& name) {
  return load_tensor(file, file->at(name));
}

// Writes CPU copies of `tensors` (any device, contiguous or not) atomically.
inline void save_tensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {}) {
  std::vector<at::Tensor> host;
  std::vector<TensorToWrite> out;
  host.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const auto dtype = dtype_of(tensor.scalar_type());
    if (!dtype)
      throw FormatError(path.string() + ": tensor '" + name + "' has dtype " + c10::toString(tensor.scalar_type()) +
                        ", which safetensors cannot hold");
    host.push_back(tensor.detach().to(at::kCPU).contiguous());
    out.push_back({name, *dtype, host.back().sizes().vec(), host.back().data_ptr()});
  }
  write_file(path, out, metadata);
}

}  // namespace dflash::sdk::safetensors
