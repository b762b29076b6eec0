// drafter/dflash: drafting through the fused CUDA kernels (drafting_fast_path.h)
// against the ATen reference path — context extensions and proposals, after
// the weights are replaced, inside captured CUDA graphs and through the
// plugin — and, on the CPU, that the ATen path is still the one that runs.
//
// Tolerances (bf16, random weights): the two paths round differently in a few
// places — the fused GEMMs may accumulate in another order than the separate
// ones, the kernels' RMSNorm sums in another order than ATen's, the o and
// down projections add the residual inside the GEMM (one rounding instead of
// two), and attention is flash attention where the ATen path's host-length
// calls use SDPA — so single elements differ by a bf16 ulp (2^-8 relative)
// here and there, and two layers and their norms carry that along. Hidden
// states and the cached keys and values must agree within 5e-2 of their
// largest magnitude: a CPU emulation of the kernels' arithmetic differed by at
// most 1.6 % at this weight scale, while wiring faults (stale weights, wrong
// rows or positions) differ by O(1) (see ReplacedWeightsReachTheFusedPath).
// Proposals (the greedy tokens of the slots' logits) must be identical except
// where the reference's best token leads the next by no more than twice the
// logits' largest difference — only there can such rounding flip the choice —
// and at least 9 in 10 must be identical.
#include "dflash_model.h"
#include "plugins/drafter/dflash/drafter_test_shapes.h"
#include "plugin/instances.h"
#include "plugin/registry.h"

#include <cuda_graph.h>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <map>
#include <set>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {
using namespace dflash::host;
namespace dd = dflash::drafter;

constexpr double kTolerance = 5e-2;
// Weights large enough that the layers, not the slots' own embeddings, decide
// the hidden states (and so the proposals) — else both paths would agree trivially.
constexpr double kInitStd = 0.2;

// max |a − b| / max |b|.
double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto fa = a.to(torch::kFloat), fb = b.to(torch::kFloat);
  return (fa - fb).abs().max().item<double>() / fb.abs().max().item<double>();
}

// A context's own copy (buffers cloned), to draft on with another path.
dd::DraftContext copy_of(const dd::DraftContext& context) {
  dd::DraftContext copy = context;
  for (auto* buffers : {&copy.keys, &copy.values})
    for (auto& t : *buffers) t = t.clone();
  copy.rotary = torch::Tensor();
  return copy;
}

// How the two paths' proposals compare over a run.
struct Agreement {
  int64_t slots = 0, identical = 0, near_ties = 0;
};

// The proposals of one block's hidden states [Bs, H], as the plugin makes
// them: slots 1 … Bs − 1 through lm_head (in the model's dtype), greedy.
void compare_proposals(const torch::Tensor& fused, const torch::Tensor& reference, const torch::Tensor& lm_head,
                       Agreement& agreement) {
  const int64_t take = reference.size(0) - 1;
  const auto fused_logits = torch::linear(fused.narrow(0, 1, take), lm_head).to(torch::kFloat);
  const auto reference_logits = torch::linear(reference.narrow(0, 1, take), lm_head).to(torch::kFloat);
  const double noise = (fused_logits - reference_logits).abs().max().item<double>();
  const auto best_two = std::get<0>(reference_logits.topk(2, -1));
  const auto margin = best_two.select(1, 0) - best_two.select(1, 1);
  agreement.slots += take;
  agreement.identical += fused_logits.argmax(-1).eq(reference_logits.argmax(-1)).sum().item<int64_t>();
  agreement.near_ties += margin.le(2 * noise).sum().item<int64_t>();
}

void expect_identical_in_practice(const Agreement& a) {
  EXPECT_GT(a.slots, 0);
  EXPECT_GE(a.identical, a.slots - a.near_ties) << "a proposal differs without a near tie";
  EXPECT_GE(10 * a.identical, 9 * a.slots) << a.identical << " of " << a.slots << " proposals identical, "
                                           << a.near_ties << " near ties";
}

// New random values for the parameter `name` shaped like `like`.
torch::Tensor random_weight(const std::string& name, const torch::Tensor& like) {
  return name.find("norm") != std::string::npos ? 1 + 0.1 * torch::randn_like(like) : kInitStd * torch::randn_like(like);
}

// Replaces every parameter's values in place, as eval's load_drafter_checkpoint does.
void replace_weights(const dd::DFlashModel& model, uint64_t seed) {
  const torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (const auto& [name, p] : model.parameters()) p.copy_(random_weight(name, p));
}

// One drafting run on the ATen path or the fused one: the context extended in
// chunks, a block drafted after each. Returns the blocks' hidden states and
// leaves the context as it ends.
std::vector<torch::Tensor> draft_run(dd::DFlashModel& model, bool fused, dd::DraftContext& context,
                                     const std::vector<torch::Tensor>& chunks, const std::vector<torch::Tensor>& blocks) {
  model.set_drafting_kernels(fused);
  std::vector<torch::Tensor> hidden;
  for (size_t step = 0; step < chunks.size(); ++step) {
    model.extend_context(context, chunks[step]);
    hidden.push_back(model.draft(context, blocks[step]));
  }
  return hidden;
}

// The one-call step's layout (extend_and_draft_positions), for every
// accepted count: the accepted rows extend the context in order, the block
// follows them, the rows past them land where no attention of this block
// (or of a later one before they are overwritten) reads them, and nothing
// lands beyond the L + R + Bs positions the plugin reserves.
TEST(DFlashFusedDrafting, TheOneCallStepPutsEveryRowWhereTheTwoCallsWould) {
  for (int64_t length : {0, 37}) {
    for (int64_t rows : {1, 8, 16}) {
      for (int64_t slots : {8, 16}) {
        for (int64_t accepted = 1; accepted <= rows; ++accepted) {
          SCOPED_TRACE("L " + std::to_string(length) + ", R " + std::to_string(rows) + ", Bs " + std::to_string(slots) +
                       ", n " + std::to_string(accepted));
          const std::vector<int64_t> v = dd::extend_and_draft_positions(length, accepted, rows, slots);
          ASSERT_EQ(static_cast<int64_t>(v.size()), rows + slots + 3);
          const int64_t keys = length + accepted + slots;
          std::set<int64_t> seen;
          for (int64_t j = 0; j < rows + slots; ++j) {
            EXPECT_TRUE(seen.insert(v[j]).second) << "two rows at position " << v[j];
            EXPECT_LT(v[j], length + rows + slots) << "row " << j << " past the reserved buffers";
          }
          for (int64_t j = 0; j < accepted; ++j) EXPECT_EQ(v[j], length + j) << "accepted row " << j;
          for (int64_t j = accepted; j < rows; ++j) EXPECT_GE(v[j], keys) << "scratch row " << j << " inside the attended keys";
          for (int64_t i = 0; i < slots; ++i) EXPECT_EQ(v[rows + i], length + accepted + i) << "slot " << i;
          EXPECT_EQ(v[rows + slots], length + accepted);
          EXPECT_EQ(v[rows + slots + 1], 0);
          EXPECT_EQ(v[rows + slots + 2], keys);
        }
      }
    }
  }
}

// On the CPU (any dtype) and on CUDA in fp32 the fused path never runs: the
// drafting calls are the ATen path, bit for bit what they compute with the
// kernels switched off, and they never build the fused path's rotary table.
TEST(DFlashFusedDrafting, TheCpuAndFp32RunTheAtenPath) {
  std::vector<std::pair<torch::Device, torch::ScalarType>> places = {{torch::kCPU, torch::kFloat},
                                                                     {torch::kCPU, torch::kBFloat16}};
  if (torch::cuda::is_available()) places.emplace_back(torch::Device("cuda:0"), torch::kFloat);
  for (const auto& [device, dtype] : places) {
    SCOPED_TRACE(device.str() + " " + std::string(c10::toString(dtype)));
    dd::DFlashModel model(dd::testing::small_gpu_shape(), 5, 0.05, dtype, device);
    EXPECT_FALSE(model.fused_drafting());
    torch::manual_seed(31);
    const auto options = torch::TensorOptions().dtype(dtype).device(device);
    const auto features = torch::randn({40, 64}, options), slots = torch::randn({8, 64}, options);
    std::vector<torch::Tensor> hidden;
    for (bool kernels : {true, false}) {
      model.set_drafting_kernels(kernels);
      dd::DraftContext context;
      model.extend_context(context, features.narrow(0, 0, 33));
      model.prepare_drafting(context);
      model.extend_context(context, features.narrow(0, 33, 7));
      hidden.push_back(model.draft(context, slots));
      EXPECT_FALSE(context.rotary.defined()) << "the fused path ran";
    }
    EXPECT_TRUE(torch::equal(hidden[0], hidden[1]));
  }
}

// On a GPU in bf16: extensions and proposals through the fused kernels
// against the ATen path, chunk by chunk, with the cache they leave.
TEST(DFlashFusedDrafting, ExtensionsAndProposalsMatchTheAtenPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda("cuda:0");
  dd::DFlashModel model(dd::testing::small_gpu_shape(), 5, kInitStd, torch::kBFloat16, cuda);
  if (!model.fused_drafting()) GTEST_SKIP() << "this build has no CUDA kernels, or no flash drafting";
  const auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(cuda);
  torch::manual_seed(32);
  const auto lm_head = torch::randn({50, 64}, options);
  std::vector<torch::Tensor> chunks, blocks;
  for (int64_t n : {37, 1, 3, 8, 2, 5, 1, 8}) {
    chunks.push_back(torch::randn({n, 64}, options));
    blocks.push_back(torch::randn({8, 64}, options));
  }
  dd::DraftContext reference_context, fused_context;
  const auto reference = draft_run(model, false, reference_context, chunks, blocks);
  const auto fused = draft_run(model, true, fused_context, chunks, blocks);
  EXPECT_TRUE(fused_context.rotary.defined()) << "the fused path did not run";
  Agreement agreement;
  for (size_t step = 0; step < reference.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_LE(relative_error(fused[step], reference[step]), kTolerance);
    compare_proposals(fused[step], reference[step], lm_head, agreement);
  }
  expect_identical_in_practice(agreement);
  const int64_t length = reference_context.length;
  ASSERT_EQ(fused_context.length, length);
  for (int64_t layer = 0; layer < 2; ++layer) {
    EXPECT_LE(relative_error(fused_context.keys[layer].narrow(0, 0, length),
                             reference_context.keys[layer].narrow(0, 0, length)),
              kTolerance);
    EXPECT_LE(relative_error(fused_context.values[layer].narrow(0, 0, length),
                             reference_context.values[layer].narrow(0, 0, length)),
              kTolerance);
  }
  // The device-length calls (what the plugin captures) agree with the host-length ones on this path too.
  dd::DraftContext at_device;
  model.reserve(at_device, length + 8);
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(cuda);
  int64_t from = 0;
  for (const auto& chunk : chunks) {
    model.extend_context_at(at_device, chunk, torch::full({1}, from, longs));
    from += chunk.size(0);
    at_device.length = from;
  }
  const auto drafted_at = model.draft_at(at_device, blocks.back(), torch::full({1}, length, longs));
  EXPECT_LE(relative_error(drafted_at, reference.back()), kTolerance);
}

// An extension and a proposal as one call of fixed shape
// (extend_and_draft_at, what the plugin's per-step graph runs): for every
// accepted count n of the R rows given, the block's hidden states and the
// context's cache are those of extend_context(n rows) then draft — on the
// fused path (one pass) and on the ATen path alike — and the rows past n
// (written as scratch after the block) change nothing a later proposal reads.
TEST(DFlashFusedDrafting, AnExtensionAndAProposalInOneCallMatchTheTwoCalls) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda("cuda:0");
  dd::DFlashModel model(dd::testing::small_gpu_shape(), 5, kInitStd, torch::kBFloat16, cuda);
  if (!model.fused_drafting()) GTEST_SKIP() << "this build has no CUDA kernels, or no flash drafting";
  const auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(cuda);
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(cuda);
  const int64_t start = 29, rows = 8, bs = 8;
  torch::manual_seed(40);
  const auto lm_head = torch::randn({50, 64}, options);
  dd::DraftContext begun;
  model.set_drafting_kernels(false);
  model.extend_context(begun, torch::randn({start, 64}, options));
  Agreement agreement;
  for (int64_t accepted : {1, 3, 8}) {
    const auto features = torch::randn({rows, 64}, options);
    const auto slots = torch::randn({bs, 64}, options), later = torch::randn({bs, 64}, options);
    dd::DraftContext reference = copy_of(begun);
    model.set_drafting_kernels(false);
    model.extend_context(reference, features.narrow(0, 0, accepted));
    const auto expected = model.draft(reference, slots);
    const auto expected_later = model.draft(reference, later);
    for (bool fused : {true, false}) {
      SCOPED_TRACE(std::string(fused ? "fused" : "ATen") + " path, " + std::to_string(accepted) + " accepted");
      model.set_drafting_kernels(fused);
      dd::DraftContext one_call = copy_of(begun);
      model.reserve(one_call, start + rows + bs);
      const auto positions = dd::extend_and_draft_positions(start, accepted, rows, bs);
      const auto where = dd::extend_and_draft_views(torch::tensor(positions, torch::kLong).to(cuda), rows, bs);
      const auto hidden = model.extend_and_draft_at(one_call, features, slots, where);
      one_call.length += accepted;
      EXPECT_LE(relative_error(hidden, expected), kTolerance);
      compare_proposals(hidden, expected, lm_head, agreement);
      for (int64_t layer = 0; layer < 2; ++layer) {
        EXPECT_LE(relative_error(one_call.keys[layer].narrow(0, 0, one_call.length),
                                 reference.keys[layer].narrow(0, 0, one_call.length)),
                  kTolerance);
        EXPECT_LE(relative_error(one_call.values[layer].narrow(0, 0, one_call.length),
                                 reference.values[layer].narrow(0, 0, one_call.length)),
                  kTolerance);
      }
      // The next proposal on the same context sees the extension and nothing of the scratch.
      const auto next = model.draft_at(one_call, later, torch::full({1}, one_call.length, longs));
      EXPECT_LE(relative_error(next, expected_later), kTolerance);
    }
  }
  expect_identical_in_practice(agreement);
}

// The fused projections are copies: replacing the parameters' values (as a
// loaded checkpoint does, after the first drafting built the copies) must
// reach the fused path.
TEST(DFlashFusedDrafting, ReplacedWeightsReachTheFusedPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda("cuda:0");
  dd::DFlashModel model(dd::testing::small_gpu_shape(), 5, kInitStd, torch::kBFloat16, cuda);
  if (!model.fused_drafting()) GTEST_SKIP() << "this build has no CUDA kernels, or no flash drafting";
  const auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(cuda);
  torch::manual_seed(33);
  const auto lm_head = torch::randn({50, 64}, options);
  const std::vector<torch::Tensor> chunks = {torch::randn({21, 64}, options), torch::randn({4, 64}, options)};
  const std::vector<torch::Tensor> blocks = {torch::randn({8, 64}, options), torch::randn({8, 64}, options)};
  dd::DraftContext before;
  const auto old_weights = draft_run(model, true, before, chunks, blocks);

  replace_weights(model, 34);
  dd::DraftContext reference_context, fused_context;
  const auto reference = draft_run(model, false, reference_context, chunks, blocks);
  const auto fused = draft_run(model, true, fused_context, chunks, blocks);
  Agreement agreement;
  for (size_t step = 0; step < reference.size(); ++step) {
    EXPECT_GT(relative_error(old_weights[step], reference[step]), 3 * kTolerance) << "the new weights change too little";
    EXPECT_LE(relative_error(fused[step], reference[step]), kTolerance);
    compare_proposals(fused[step], reference[step], lm_head, agreement);
  }
  expect_identical_in_practice(agreement);
}

// Captured as CUDA graphs (the plugin's proposal and extension), replayed
// after the context grew and after the weights were replaced (with
// prepare_drafting before the replay, as the plugin calls it): each replay
// computes exactly what the same call computes eagerly, and matches the ATen
// path on the same context.
TEST(DFlashFusedDrafting, CapturedGraphsReplayTheFusedPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda("cuda:0");
  dd::DFlashModel model(dd::testing::small_gpu_shape(), 5, kInitStd, torch::kBFloat16, cuda);
  if (!model.fused_drafting()) GTEST_SKIP() << "this build has no CUDA kernels, or no flash drafting";
  const auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(cuda);
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(cuda);
  const int64_t context = 29, bs = 8, n = 5;
  torch::manual_seed(35);
  const auto features = torch::randn({context + 2 * n, 64}, options);
  const auto slots = torch::randn({bs, 64}, options);

  dd::DraftContext ctx;
  model.reserve(ctx, context + 2 * n + bs);
  model.extend_context_at(ctx, features.narrow(0, 0, context), torch::zeros({1}, longs));
  ctx.length = context;
  const auto base = torch::full({1}, context, longs);
  const auto chunk = features.narrow(0, context, n).clone();  // the extension graph's static input

  dflash::decode_support::CudaGraphPool pool(cuda);
  std::string error;
  torch::Tensor out;
  const auto propose = pool.capture([&] { out = model.draft_at(ctx, slots, base); }, error);
  if (!dflash::decode_support::kCudaGraphs) GTEST_SKIP() << error;
  ASSERT_TRUE(propose) << error;
  const auto extend = pool.capture([&] { model.extend_context_at(ctx, chunk, base); }, error);
  ASSERT_TRUE(extend) << error;

  auto check_replay = [&](const std::string& when) {
    SCOPED_TRACE(when);
    model.prepare_drafting(ctx);
    propose->replay();
    const auto replayed = out.clone();
    EXPECT_TRUE(torch::equal(replayed, model.draft_at(ctx, slots, base))) << "a replay differs from the eager call";
    dd::DraftContext reference_context = copy_of(ctx);
    model.set_drafting_kernels(false);
    const auto reference = model.draft(reference_context, slots);
    model.set_drafting_kernels(true);
    EXPECT_LE(relative_error(replayed, reference), kTolerance);
  };
  // The context grows by the extension graph (its static input refilled), and the proposal follows.
  for (int64_t step = 0; step < 2; ++step) {
    model.prepare_drafting(ctx);
    extend->replay();
    ctx.length += n;
    base.fill_(ctx.length);
    if (step == 0) chunk.copy_(features.narrow(0, context + n, n));
  }
  check_replay("after the context grew");
  replace_weights(model, 36);
  check_replay("after the weights were replaced");
}

// Through the plugin with its graphs (decode_graphs: auto): kernels auto
// against kernels aten, the same weights, the same drafting sessions; then
// the weights replaced through parameters(), as eval's checkpoint loading
// does, and again.
// A small dflash drafter on the GPU, bound to `gpu`'s target and set for
// decoding: its layer ops (`kernels`) and its drafting graphs (`graphs`) as asked.
std::unique_ptr<DrafterInstance> decoding_drafter(const PluginRecord& record, const dd::testing::GpuTarget& gpu,
                                                  const std::string& kernels, const std::string& graphs) {
  const nlohmann::json config = {{"num_layers", 2}, {"num_attention_heads", 0}, {"num_key_value_heads", 0},
                                 {"head_dim", 0}, {"intermediate_size", 0}, {"block_size", 8}, {"max_anchors", 6},
                                 {"gamma", 0.0}, {"mask_token_id", -1}, {"target_layer_ids", {1, 5}}, {"init_std", kInitStd},
                                 {"rope_theta", 0.0}, {"attention", "grouped"}, {"attention_group_blocks", 64},
                                 {"attention_group_key_multiple", 128}, {"attention_kernel", "auto"},
                                 {"embedding_on_cpu", false},
                                 {"activation_checkpointing", false}, {"decode_graphs", graphs}, {"kernels", kernels}};
  auto drafter = std::make_unique<DrafterInstance>(record, config, InstanceOptions{"cuda:0", "bfloat16", 3});
  drafter->bind_target(gpu.info, gpu.frozen);
  drafter->set_training(false);
  return drafter;
}

TEST(DFlashFusedDrafting, ThePluginsProposalsMatchTheAtenPluginAndFollowLoadedWeights) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  const PluginRecord& record = registry.find(DFLASH_KIND_DRAFTER, "dflash");
  const dd::testing::GpuTarget gpu = dd::testing::small_gpu_target(37);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  std::vector<std::unique_ptr<DrafterInstance>> drafters;  // fused, then ATen
  for (const char* kernels : {"auto", "aten"}) drafters.push_back(decoding_drafter(record, gpu, kernels, "auto"));
  auto decode = [&](uint64_t seed) {  // one session per drafter: extensions and proposals
    std::vector<std::vector<torch::Tensor>> proposals(2);
    std::vector<int64_t> sessions;
    for (const auto& d : drafters) sessions.push_back(d->draft_begin());
    torch::manual_seed(seed);
    const auto ids = torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA);
    for (int64_t n : {12, 3, 3, 1, 3, 1, 1, 3}) {  // repeated lengths replay their graphs
      const NamedTensors inputs = {{"input_ids", torch::randint(0, 50, {n}, ids)},
                                   {"hidden.1", torch::randn({n, 64}, cuda)},
                                   {"hidden.5", torch::randn({n, 64}, cuda)}};
      const NamedTensors last = {{"last_token", torch::randint(0, 50, {1}, ids)}};
      for (size_t i = 0; i < drafters.size(); ++i) {
        drafters[i]->draft_extend(sessions[i], inputs);
        proposals[i].push_back(drafters[i]->draft_propose(sessions[i], last, 7).to(torch::kCPU));
      }
    }
    for (size_t i = 0; i < drafters.size(); ++i) drafters[i]->draft_end(sessions[i]);
    return proposals;
  };
  const int64_t total = 8 * 7;  // 8 proposals of 7 tokens
  auto identical = [](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    int64_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i].eq(b[i]).sum().item<int64_t>();
    return same;
  };
  const auto before = decode(38);
  for (const auto& p : before[0]) EXPECT_EQ(p.numel(), 7);
  const int64_t same_before = identical(before[0], before[1]);
  EXPECT_GE(10 * same_before, 9 * total) << same_before << " of " << total << " proposals identical";

  {  // new weights, the same for both, copied into the live parameters
    const torch::NoGradGuard no_grad;
    torch::manual_seed(39);
    std::map<std::string, torch::Tensor> weights;
    for (const auto& [name, p] : drafters[0]->parameters()) weights[name] = random_weight(name, p);
    for (const auto& d : drafters)
      for (const auto& [name, p] : d->parameters()) p.copy_(weights.at(name));
  }
  const auto after = decode(38);
  const int64_t same_after = identical(after[0], after[1]);
  EXPECT_GE(10 * same_after, 9 * total) << same_after << " of " << total << " proposals identical after the load";
  EXPECT_LT(2 * identical(before[1], after[1]), total)
      << "the new weights hardly change the ATen plugin's proposals: the check above would prove nothing";
}

// A tree's candidates (draft_propose_topk) through the CUDA graphs of the
// fused drafting step (an accepted path's extension folded into the next
// proposal) against a drafter with graphs off: the same best tokens and
// log-probabilities up to bf16 rounding, each slot's sorted best first.
TEST(DFlashFusedDrafting, TopKProposalsThroughGraphsMatchTheEagerOnes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  const PluginRecord& record = registry.find(DFLASH_KIND_DRAFTER, "dflash");
  const dd::testing::GpuTarget gpu = dd::testing::small_gpu_target(41);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  std::vector<std::unique_ptr<DrafterInstance>> drafters;  // graphs, then none
  for (const char* graphs : {"auto", "off"}) drafters.push_back(decoding_drafter(record, gpu, "auto", graphs));
  std::vector<int64_t> sessions;
  for (const auto& d : drafters) sessions.push_back(d->draft_begin());
  torch::manual_seed(42);
  const auto ids = torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA);
  const int64_t k = 5;
  int64_t same = 0, total = 0;
  for (int64_t n : {12, 3, 3, 1, 3, 1, 1, 3}) {  // repeated lengths replay their graphs
    const NamedTensors inputs = {{"input_ids", torch::randint(0, 50, {n}, ids)},
                                 {"hidden.1", torch::randn({n, 64}, cuda)},
                                 {"hidden.5", torch::randn({n, 64}, cuda)}};
    const NamedTensors last = {{"last_token", torch::randint(0, 50, {1}, ids)}};
    std::vector<DrafterInstance::TopK> got;
    for (size_t i = 0; i < drafters.size(); ++i) {
      drafters[i]->draft_extend(sessions[i], inputs);
      got.push_back(drafters[i]->draft_propose_topk(sessions[i], last, 7, k));
    }
    for (const auto& g : got) {
      ASSERT_EQ(g.tokens.sizes(), (torch::IntArrayRef{7, k}));
      ASSERT_EQ(g.log_probs.sizes(), (torch::IntArrayRef{7, k}));
      const auto lp = g.log_probs.to(torch::kCPU, torch::kFloat);
      EXPECT_TRUE(lp.isfinite().all().item<bool>());
      EXPECT_TRUE((lp.narrow(1, 0, k - 1) >= lp.narrow(1, 1, k - 1)).all().item<bool>()) << "best first";
      EXPECT_TRUE((lp <= 0).all().item<bool>());
    }
    const auto a = got[0].tokens.to(torch::kCPU), b = got[1].tokens.to(torch::kCPU);
    same += a.eq(b).sum().item<int64_t>();
    total += a.numel();
    const auto rows_equal = a.eq(b).all(1);
    const auto la = got[0].log_probs.to(torch::kCPU, torch::kFloat), lb = got[1].log_probs.to(torch::kCPU, torch::kFloat);
    for (int64_t r = 0; r < 7; ++r)
      if (rows_equal[r].item<bool>()) EXPECT_LE((la[r] - lb[r]).abs().max().item<float>(), 0.1f) << "slot " << r;
  }
  EXPECT_GE(10 * same, 9 * total) << same << " of " << total << " candidates identical";
  for (size_t i = 0; i < drafters.size(); ++i) drafters[i]->draft_end(sessions[i]);
}

}  // namespace
