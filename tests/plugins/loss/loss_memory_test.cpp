// Memory is a tested property. A counting CPU allocator is installed for this
// test program (LibTorch allocates every CPU tensor through it, in the host
// and in the plugins alike), and the peak of live tensor bytes is measured
// over forward + backward of every loss on the chunked-loss toolkit and of a
// loss that keeps its full logits.
#include "memory/cpu_tensor_bytes.h"
#include "plugin/instances.h"
#include "plugin/registry.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <algorithm>

namespace {
using namespace dflash::host;

// The host's own counter (memory/cpu_tensor_bytes.h), installed for this
// program as dflash-host installs it.
struct Counter {
  Counter() { dflash::memory::install_cpu_tensor_counter(); }
  int64_t current() const { return dflash::memory::cpu_tensor_bytes().current; }
  int64_t peak() const { return dflash::memory::cpu_tensor_bytes().peak; }
  void reset_peak() const { dflash::memory::reset_cpu_tensor_peak(); }
};

const Counter& counting_allocator() {
  static const Counter counter;
  return counter;
}

const PluginRecord& loss_record(const std::string& name) {
  static PluginRegistry* registry = [] {
    auto* made = new PluginRegistry();
    made->add_directory(DFLASH_INTREE_PLUGIN_DIR);
    made->add_directory(DFLASH_SDK_EXAMPLES_PLUGIN_DIR);
    made->add_directory(DFLASH_GOOD_PLUGIN_DIR);
    return made;
  }();
  return registry->find(DFLASH_KIND_LOSS, name);
}

constexpr int64_t kHidden = 64, kVocab = 4096, kTopK = 16, kChunk = 32;

struct Arm {
  const char* plugin;
  nlohmann::json config;
  dflash_teacher_kind teacher;
};

// Every loss on the chunked-loss toolkit: the in-tree ones and the SDK's examples.
const Arm kChunked[] = {
    {"ce", {}, DFLASH_TEACHER_NONE},
    {"kl", {{"kl_weight", 0.5}}, DFLASH_TEACHER_HIDDEN},
    {"topk_kl", {{"kl_weight", 0.5}}, DFLASH_TEACHER_TOPK},
    {"fused_ckpt_kl", {{"kl_weight", 0.5}}, DFLASH_TEACHER_HIDDEN},
    {"example_weighted_ce", {{"temperature", 1.0}}, DFLASH_TEACHER_NONE},
    {"example_reverse_kl", {{"temperature", 1.0}}, DFLASH_TEACHER_HIDDEN},
    {"example_jsd", {{"beta", 0.5}, {"temperature", 1.0}}, DFLASH_TEACHER_HIDDEN},
};

nlohmann::json full_config(const PluginRecord& record, nlohmann::json config) {
  for (auto& [key, property] : record.schema.at("properties").items())
    if (!config.contains(key)) config[key] = property.at("default");
  return config;
}

struct Peak {
  int64_t measured = 0;    // live bytes above what existed before the call, over forward + backward
  uint64_t estimated = 0;  // the plugin's own estimate_memory for the same shape
};

Peak peak_of(const Arm& arm, int64_t rows, bool with_chunk = true) {
  const Counter& counter = counting_allocator();
  torch::manual_seed(0);
  auto hidden = torch::randn({rows, kHidden}).requires_grad_(true);
  auto weight = torch::randn({kVocab, kHidden}) * 0.3;
  auto teacher = torch::randn({rows, kHidden});
  auto targets = torch::randint(0, kVocab, {rows}, torch::kLong);
  auto row_weights = torch::rand({rows});
  auto topk = torch::randn({rows, kVocab}).topk(kTopK, 1);
  auto topk_logprobs = (std::get<0>(topk) - std::get<0>(topk).logsumexp(1, true)) - 1.0;  // mass e^-1 in the top K
  auto topk_ids = std::get<1>(topk);
  const PluginRecord& record = loss_record(arm.plugin);
  nlohmann::json config = arm.config;
  if (with_chunk) config["chunk_size"] = kChunk;
  LossInstance loss(record, full_config(record, config), {});
  Peak peak;
  const dflash_loss_shape shape{sizeof(dflash_loss_shape), rows, kHidden, kVocab, kTopK, arm.teacher, 4, 0};
  if (auto estimate = loss.estimate_memory(shape)) peak.estimated = estimate->peak_bytes;
  LossCall call{hidden, weight, targets, -100, row_weights, arm.teacher};
  if (arm.teacher == DFLASH_TEACHER_HIDDEN) call.teacher_hidden = teacher;
  if (arm.teacher == DFLASH_TEACHER_TOPK) {
    call.teacher_topk_ids = topk_ids;
    call.teacher_topk_logprobs = topk_logprobs;
  }
  const int64_t before = counter.current();
  counter.reset_peak();
  {
    LossOutput out = loss.compute(call);
    out.loss.backward();
  }
  EXPECT_TRUE(hidden.grad().defined()) << arm.plugin;
  peak.measured = counter.peak() - before;
  return peak;
}

// Four times the rows is four times the chunks: a chunked loss's peak may
// grow only by what is per row ([N, H] gradients, [N] metrics), never by
// [chunk, V] per chunk; and its own estimate (the planner's figure) covers
// what it really used.
TEST(LossMemory, EveryChunkedLossHasAPeakIndependentOfTheNumberOfChunks) {
  const int64_t few = 512, many = 2048;
  const int64_t per_row = 4 * kHidden * 4 + 16 * 8;         // four [N, H] fp32 tensors, sixteen [N] doubles
  const int64_t chunk_workspace = kChunk * kVocab * 4;     // one [chunk, V] fp32 buffer
  for (const Arm& arm : kChunked) {
    const Peak small = peak_of(arm, few), large = peak_of(arm, many);
    std::cout << arm.plugin << ": peak extra bytes " << small.measured << " at " << few / kChunk << " chunks, "
              << large.measured << " at " << many / kChunk << " chunks; estimate " << large.estimated << "\n";
    EXPECT_LE(large.measured - small.measured, (many - few) * per_row)
        << arm.plugin << ": the peak grows with the number of chunks";
    EXPECT_LE(large.measured, 16 * chunk_workspace + many * per_row) << arm.plugin << ": more than a chunk's workspace";
    EXPECT_GE(static_cast<int64_t>(large.estimated), large.measured)
        << arm.plugin << ": estimate_memory is below what the loss used";
  }
}

// The same measurement sees a loss that keeps full [N, V] logits for
// backward (tests/fixtures/plugins/good's test_loss): the test can fail.
TEST(LossMemory, AFullLogitsLossGrowsWithTheRowsTimesTheVocabulary) {
  const Arm full{"test_loss", {}, DFLASH_TEACHER_NONE};
  const Peak small = peak_of(full, 512, false), large = peak_of(full, 2048, false);
  EXPECT_GE(large.measured - small.measured, (2048 - 512) * kVocab * 4);
}

TEST(LossMemory, TheCounterSeesTensorAllocations) {
  const Counter& counter = counting_allocator();
  const int64_t before = counter.current();
  {
    auto t = torch::empty({1024, 1024});  // 4 MiB
    EXPECT_GE(counter.current() - before, 4 << 20);
  }
  EXPECT_EQ(counter.current(), before);
}

}  // namespace
