// Host → device copies that do not wait for the device. A copy from pageable
// host memory waits for every kernel queued before it; in a training step
// that leaves the GPU idle while the host prepares the next launches. From
// page-locked memory the copy is queued like a kernel, and LibTorch's caching
// host allocator keeps the staging block until it has run.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <vector>

namespace dflash::decode_support {

// A CPU tensor holding `values` in page-locked memory when `device` is a GPU,
// so that copying it there is asynchronous (no wait for the device). The
// caching host allocator keeps the block until the copy has run.
inline at::Tensor host_staging(const std::vector<int64_t>& values, const c10::Device& device) {
  at::TensorOptions options = at::TensorOptions().dtype(at::kLong);
  if (device.is_cuda()) options = options.pinned_memory(true);
  at::Tensor out = at::empty({static_cast<int64_t>(values.size())}, options);
  std::copy(values.begin(), values.end(), out.data_ptr<int64_t>());
  return out;
}

// `values` on `device` as int64, without waiting for the device: a pinned,
// non-blocking upload on a GPU.
inline at::Tensor upload(const std::vector<int64_t>& values, const c10::Device& device) {
  const at::Tensor staged = host_staging(values, device);
  return device.is_cpu() ? staged : staged.to(device, at::kLong, /*non_blocking=*/true);
}

// `t` on `device` in its own dtype: as is when it is already there; from the
// host to a GPU through page-locked memory, without waiting for the device;
// otherwise a plain copy.
inline at::Tensor on_device(const at::Tensor& t, const c10::Device& device) {
  if (t.device() == device) return t;
  if (!device.is_cuda() || !t.device().is_cpu()) return t.to(device);
  at::Tensor staged = at::empty(t.sizes(), t.options().pinned_memory(true));
  staged.copy_(t);
  return staged.to(device, staged.scalar_type(), /*non_blocking=*/true);
}

// An int64 tensor of ids on `device`: used as is when it is already there,
// else uploaded without waiting for the device.
inline at::Tensor ids_on(const at::Tensor& ids, const c10::Device& device) { return on_device(ids.to(at::kLong), device); }

}  // namespace dflash::decode_support
