// Memory is a tested property. A counting CPU allocator is installed for this
// test program (LibTorch allocates every CPU tensor through it, in the host
// and in the plugins alike), and the peak of live tensor bytes is measured
// over forward + backward of fused_ckpt_kl and of the plain kl.
#include "plugin/instances.h"
#include "plugin/registry.h"

#include <dflash/sdk/torch_compat.hpp>

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>

namespace {
using namespace dflash::host;

// Wraps LibTorch's own CPU allocator and counts the bytes it hands out.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t bytes) DFLASH_COMPAT_ALLOCATE_QUALIFIER override {
    c10::DataPtr inner = inner_->allocate(bytes);
    void* data = inner.get();
    auto* record = new Record{std::move(inner), bytes, const_cast<CountingCpuAllocator*>(this)};
    record->owner->add(static_cast<int64_t>(bytes));
    return {data, record, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  DFLASH_COMPAT_ALLOCATOR_COPY_DATA

  void reset_peak() { peak_ = current_.load(); }
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }

 private:
  struct Record {
    c10::DataPtr inner;  // frees through the wrapped allocator when deleted
    size_t bytes;
    CountingCpuAllocator* owner;
  };
  static void release(void* context) {
    auto* record = static_cast<Record*>(context);
    record->owner->add(-static_cast<int64_t>(record->bytes));
    delete record;
  }
  void add(int64_t bytes) {
    const int64_t now = current_ += bytes;
    int64_t seen = peak_;
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
  }
  c10::Allocator* inner_;
  std::atomic<int64_t> current_{0}, peak_{0};
};

CountingCpuAllocator& counting_allocator() {
  static CountingCpuAllocator* allocator = [] {
    auto* made = new CountingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(made, /*priority=*/255);
    return made;
  }();
  return *allocator;
}

const PluginRecord& loss_record(const std::string& name) {
  static PluginRegistry* registry = [] {
    auto* made = new PluginRegistry();
    made->add_directory(DFLASH_INTREE_PLUGIN_DIR);
    return made;
  }();
  return registry->find(DFLASH_KIND_LOSS, name);
}

constexpr int64_t kRows = 4096, kHidden = 64, kVocab = 8192, kChunk = 64;

// Peak live bytes above what existed before the call, over forward + backward.
int64_t peak_of(const std::string& plugin, const nlohmann::json& config) {
  CountingCpuAllocator& counter = counting_allocator();
  torch::manual_seed(0);
  auto hidden = torch::randn({kRows, kHidden}).requires_grad_(true);
  auto weight = torch::randn({kVocab, kHidden}) * 0.3;
  auto teacher = torch::randn({kRows, kHidden});
  auto targets = torch::randint(0, kVocab, {kRows}, torch::kLong);
  auto row_weights = torch::rand({kRows});
  LossInstance loss(loss_record(plugin), config, {});
  const int64_t before = counter.current();
  counter.reset_peak();
  {
    LossOutput out = loss.compute({hidden, weight, targets, -100, row_weights, DFLASH_TEACHER_HIDDEN, teacher});
    out.loss.backward();
  }
  EXPECT_TRUE(hidden.grad().defined());
  return counter.peak() - before;
}

TEST(LossMemory, FusedStaysWithinAChunkWhilePlainKlNeedsNTimesV) {
  const int64_t chunk_workspace = kChunk * kVocab * 4;  // one [chunk, V] fp32 buffer
  const int64_t rows_by_hidden = kRows * kHidden * 4;   // [N, H] fp32 (dh, and the grad handed back)
  const int64_t rows_by_vocab = kRows * kVocab * 4;     // [N, V] fp32

  const int64_t fused = peak_of("fused_ckpt_kl", {{"kl_weight", 0.5}, {"temperature", 1.0}, {"reduction", "mean"},
                                                  {"chunk_size", kChunk}, {"chunk_memory_mb", 512}});
  const int64_t plain = peak_of("kl", {{"kl_weight", 0.5}, {"temperature", 1.0}, {"reduction", "mean"}});
  std::cout << "peak extra bytes: fused_ckpt_kl " << fused << " (chunk workspace " << chunk_workspace
            << ", [N,H] " << rows_by_hidden << "), kl " << plain << " ([N,V] " << rows_by_vocab << ")\n";

  EXPECT_GE(plain, rows_by_vocab) << "the plain KL materialises at least one [N, V] tensor";
  EXPECT_LE(fused, 8 * chunk_workspace + 4 * rows_by_hidden)
      << "fused_ckpt_kl must stay within a small multiple of one chunk plus [N, H]";
  EXPECT_LT(fused * 10, plain) << "and be an order of magnitude below the plain KL here";
}

TEST(LossMemory, TheCounterSeesTensorAllocations) {
  CountingCpuAllocator& counter = counting_allocator();
  const int64_t before = counter.current();
  {
    auto t = torch::empty({1024, 1024});  // 4 MiB
    EXPECT_GE(counter.current() - before, 4 << 20);
  }
  EXPECT_EQ(counter.current(), before);
}

}  // namespace
