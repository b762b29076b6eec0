// dflash/sdk/cpu_tensor_counter.hpp — the bytes of live CPU tensors,
// counted as LibTorch allocates and frees them: what a CPU run's memory
// figures mean (tensor memory, comparable with a plan), not the process's
// resident set. The host installs it for `train` and `plan`; a plugin
// author's test installs it to hold a loss to its declared bound
// (loss_testing.hpp). One counter per process image that includes this
// header and installs it.
#pragma once

#include <dflash/sdk/torch_compat.hpp>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace dflash::sdk {

struct CpuTensorBytes {
  int64_t current = 0, peak = 0;  // peak: since the last reset_cpu_tensor_peak (or the install)
};

namespace detail {

// Wraps LibTorch's CPU allocator. Each allocation is returned with its own
// data pointer as context (as the default allocator does: raw_allocate,
// which oneDNN's and other kernels' scratch buffers use, requires it), and
// its size and the wrapped allocator's DataPtr are kept in a table until
// the deleter removes them.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t bytes) DFLASH_COMPAT_ALLOCATE_QUALIFIER override {
    c10::DataPtr inner = inner_->allocate(bytes);
    void* data = inner.get();
    if (data == nullptr) return inner;  // nothing to count (0 bytes)
    auto* self = const_cast<CountingCpuAllocator*>(this);
    {
      const std::lock_guard<std::mutex> lock(self->mutex_);
      self->live_.emplace(data, Entry{std::move(inner), bytes});
    }
    self->add(static_cast<int64_t>(bytes));
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  DFLASH_COMPAT_ALLOCATOR_COPY_DATA

  CpuTensorBytes bytes() const { return {current_.load(), peak_.load()}; }
  void reset_peak() { peak_ = current_.load(); }

  static std::atomic<CountingCpuAllocator*>& installed() {
    static std::atomic<CountingCpuAllocator*> counter{nullptr};
    return counter;
  }

 private:
  struct Entry {
    c10::DataPtr inner;  // frees through the wrapped allocator when erased
    size_t bytes = 0;
  };
  static void release(void* data) {
    CountingCpuAllocator* self = installed().load();
    Entry entry;
    {
      const std::lock_guard<std::mutex> lock(self->mutex_);
      auto it = self->live_.find(data);
      if (it == self->live_.end()) return;  // not ours: cannot happen, and freeing a stranger would be worse
      entry = std::move(it->second);
      self->live_.erase(it);
    }
    self->add(-static_cast<int64_t>(entry.bytes));
    // entry.inner frees the memory as it goes out of scope, outside the lock.
  }
  void add(int64_t bytes) {
    const int64_t now = current_ += bytes;
    int64_t seen = peak_;
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
  }
  c10::Allocator* inner_;
  std::mutex mutex_;
  std::unordered_map<void*, Entry> live_;
  std::atomic<int64_t> current_{0}, peak_{0};
};

}  // namespace detail

// Installs the counter in front of LibTorch's CPU allocator (once; later
// calls do nothing). Tensors allocated before it free as they always did,
// uncounted: install it first thing in main.
inline void install_cpu_tensor_counter() {
  auto& installed = detail::CountingCpuAllocator::installed();
  if (installed.load() != nullptr) return;
  // Never deleted: tensors anywhere in the process may outlive any owner.
  auto* counter = new detail::CountingCpuAllocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(counter, /*priority=*/255);
  installed = counter;
}
inline bool cpu_tensor_counter_installed() { return detail::CountingCpuAllocator::installed().load() != nullptr; }
inline CpuTensorBytes cpu_tensor_bytes() {
  const auto* counter = detail::CountingCpuAllocator::installed().load();
  return counter != nullptr ? counter->bytes() : CpuTensorBytes{};
}
inline void reset_cpu_tensor_peak() {
  if (auto* counter = detail::CountingCpuAllocator::installed().load()) counter->reset_peak();
}

}  // namespace dflash::sdk
