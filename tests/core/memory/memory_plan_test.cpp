// The memory planner: its arithmetic per category against values worked out
// by hand for a small config, the phase model, the knob search, the `plan`
// command and the check before `train`, and the out-of-memory report with
// its emergency checkpoint.
#include "memory/memory_plan.h"
#include "train/run_plan.h"
#include "config/config_schema.h"
#include "train/train_schema.h"
#include "memory/oom_report.h"
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "train/frozen_weights.h"

#include <dflash/sdk/safetensors_torch.hpp>

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include "support/expect.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace {
using namespace dflash;

// The small config of the by-hand figures below: the committed tiny Qwen3
// target (H 72, I 100, 6 heads / 2 KV heads × 16, V 301, 4 layers, untied),
// 2 rows × 64 tokens, a one-layer DFlash drafter with blocks of 4 and 8
// anchors per row, fp32 on the CPU, teacher hidden states.
nlohmann::json small_root(const std::string& output = "runs/plan-test") {
  return {{"train", {{"seed", 3}, {"device", "cpu"}, {"dtype", "float32"}, {"precision", "same"}, {"grad_accumulation", 1},
                     {"teacher", "hidden"}, {"memory_slack", 0.05}, {"steps", 6}, {"lr", 3e-3}, {"output_dir", output},
                     {"progress", "lines"}}},
          {"data", {{"plugin", "synthetic"}, {"vocab_size", 0}, {"sequences", 64}, {"min_length", 24}, {"max_length", 64},
                    {"row_length", 64}, {"tokens_per_batch", 128}, {"branching", 2}}},
          {"target", {{"plugin", "hf_decoder"}, {"path", std::string(DFLASH_HF_FIXTURES) + "/qwen3"}}},
          {"drafter", {{"plugin", "dflash"}, {"num_layers", 1}, {"block_size", 4}, {"max_anchors", 8}}},
          {"loss", {{"plugin", "fused_ckpt_kl"}, {"kl_weight", 0.5}}},
          {"scheduler", {{"plugin", "constant"}}}};
}

// Fills every plugin section with its schema's defaults, as the host's
// config resolution does.
nlohmann::json with_defaults(const host::PluginRegistry& registry, nlohmann::json root) {
  const nlohmann::json train_defaults = config::defaults_of(train::train_schema());
  for (const auto& [key, value] : train_defaults.items())
    if (!root["train"].contains(key)) root["train"][key] = value;
  for (dflash_kind kind : {DFLASH_KIND_DATA_SOURCE, DFLASH_KIND_TARGET_MODEL, DFLASH_KIND_DRAFTER, DFLASH_KIND_LOSS}) {
    const char* section = kind == DFLASH_KIND_DATA_SOURCE ? "data" : kind == DFLASH_KIND_TARGET_MODEL ? "target"
                          : kind == DFLASH_KIND_DRAFTER ? "drafter" : "loss";
    const auto& record = registry.find(kind, root[section]["plugin"].get<std::string>());
    for (const auto& [key, property] : record.schema.at("properties").items())
      if (!root[section].contains(key) && property.contains("default")) root[section][key] = property.at("default");
  }
  return root;
}

host::PluginRegistry registry() {
  host::PluginRegistry r(/*log_problems=*/false);
  r.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  r.add_directory(DFLASH_GOOD_PLUGIN_DIR);
  return r;
}

int64_t line(const memory::DevicePlan& plan, const std::string& category) {
  for (const auto& l : plan.lines)
    if (l.category == category) return l.bytes;
  ADD_FAILURE() << "no line '" << category << "' in the plan";
  return -1;
}

// A drafter with a head of its own (ABI 1.6) states its loss's shape: the
// plan sizes the loss over its vocabulary with a trainable weight and a
// teacher head of its own, and counts that teacher head; without those facts
// the loss would be sized over the target's 301 tokens.
TEST(MemoryPlan, ADrafterWithItsOwnHeadSizesTheLossOverItsVocabulary) {
  const host::PluginRegistry plugins = registry();
  nlohmann::json small = small_root();
  small["drafter"] = {{"plugin", "test_vocab_drafter"}, {"draft_vocab", 7}};
  const nlohmann::json root = with_defaults(plugins, small);
  const memory::DevicePlan plan = train::plan_run(plugins, root);
  ASSERT_TRUE(plan.complete()) << plan.missing.front();
  EXPECT_EQ(line(plan, "drafter weights"), (2 * 72 * 72 + 7 * 72) * 4);
  EXPECT_EQ(line(plan, "the drafter's teacher head (the target's lm_head rows of its vocabulary)"), 7 * 72 * 4);
  host::InstanceOptions options;
  nlohmann::json loss_config = root["loss"];
  loss_config.erase("plugin");
  const host::LossInstance loss(plugins.find(DFLASH_KIND_LOSS, "fused_ckpt_kl"), loss_config, options);
  // 2 rows of 64 tokens: 128 loss rows of width 72.
  dflash_loss_shape own{sizeof(dflash_loss_shape), 128, 72, 7, 0, DFLASH_TEACHER_HIDDEN, 4, 1, 1, 72};
  dflash_loss_shape target_head{sizeof(dflash_loss_shape), 128, 72, 301, 0, DFLASH_TEACHER_HIDDEN, 4, 0, 0, 0};
  const auto estimate = loss.estimate_memory(own), on_target_head = loss.estimate_memory(target_head);
  ASSERT_TRUE(estimate.has_value() && on_target_head.has_value());
  EXPECT_EQ(line(plan, "loss: kept for backward"), static_cast<int64_t>(estimate->saved_for_backward_bytes));
  EXPECT_EQ(line(plan, "loss: working memory at its peak"),
            static_cast<int64_t>(estimate->peak_bytes - estimate->saved_for_backward_bytes));
  ASSERT_NE(estimate->peak_bytes, on_target_head->peak_bytes);  // so the line above tells the two apart
}

TEST(MemoryPlan, EveryCategoryMatchesTheHandComputedValueForASmallConfig) {
  const host::PluginRegistry plugins = registry();
  // Attention keeping every call's q, k and v first (the default, rows, has
  // its own block below).
  nlohmann::json calls_root = small_root();
  calls_root["drafter"]["attention_keeps"] = "calls";
  const nlohmann::json root = with_defaults(plugins, calls_root);
  const memory::DevicePlan plan = train::plan_run(plugins, root);
  ASSERT_TRUE(plan.complete()) << plan.missing.front();

  // Target weights: embed + lm_head 2·301·72, final norm 72, and per layer
  // 2 norms 144 + qkv 160·72 + o 72·96 + q/k norms 32 + gate/up/down 3·100·72
  // = 40,208; 4 layers → 204,248 fp32 elements.
  EXPECT_EQ(line(plan, "target weights (4 layers, float32)"), 204248 * 4);
  // The frozen verifier weights alias the target's (same device and dtype).
  EXPECT_EQ(line(plan, "frozen verifier weights (embed_tokens, lm_head, final_norm)"), 0);
  // Drafter: fc 72·72 + hidden norm 72 + final norm 72 + one layer 40,208 = 45,536.
  EXPECT_EQ(line(plan, "drafter weights"), 45536 * 4);
  EXPECT_EQ(line(plan, "drafter gradients"), 45536 * 4);
  EXPECT_EQ(line(plan, "AdamW states (exp_avg, exp_avg_sq)"), 2 * 45536 * 4);
  // The per-tensor loop's fp32 temporaries: 5 × the largest tensor (gate, 100·72).
  EXPECT_EQ(line(plan, "optimizer working memory"), 5 * 7200 * 4);
  // 4 int64 tensors of [2, 64]; features: hidden.1 and last_hidden, [2, 64, 72] fp32.
  EXPECT_EQ(line(plan, "batch on the device (ids, masks, positions, documents)"), 4 * 8 * 128);
  EXPECT_EQ(line(plan, "hidden-state items in flight: 1 × 2 × [2, 64, 72]"), 2 * 128 * 72 * 4);

  // The drafter's step: Q = 2·8·4 = 64 slots, C = 128 context positions,
  // N = 2·8·3 = 48 loss rows; e = 4. The layer ops are fused (the default):
  // a norm keeps its input and an fp32 rsqrt per normalised vector.
  // Context: fc input 4·128·72 + the norm's input 4·128·72 and rsqrt 4·128 + context 4·128·72.
  EXPECT_EQ(line(plan, "drafter context: fc input, fc + norm"), 36864 + 37376 + 36864);
  // Attention (the CPU's SDPA math path, K/V repeated to 6 heads):
  //   input norm + q/k/v: x 18,432 + rsqrt 256 (h is recomputed) + q before its norm 4·64·96 + its rsqrt 4·64·6
  //   + rotated q 4·64·96 + slots' k before its norm 4·64·32 + its rsqrt 4·64·2 + slots' k/v 8·64·96
  //   + output and copy 8·64·96 + log-sum-exp 4·6·64 + probabilities 4·6·(2·32·96) + scaled q 4·64·96.
  EXPECT_EQ(line(plan, "drafter layer 0: attention"),
            18432 + 256 + 24576 + 1536 + 24576 + 8192 + 512 + 49152 + 49152 + 1536 + 147456 + 24576);
  // Context K/V: k before its norm 4·128·32 and its rsqrt 4·128·2, K and V repeated 8·128·96.
  EXPECT_EQ(line(plan, "drafter layer 0: context K/V projections"), 16384 + 1024 + 98304);
  // MLP block: y 4·64·72, its rsqrt 4·64, gate|up 8·64·100.
  EXPECT_EQ(line(plan, "drafter layer 0: MLP"), 18432 + 256 + 51200);
  // Masks: one group per row, 32 queries × 96 keys (already a multiple of 16),
  // fp32; rotary tables 8·(64 + 128 + 64)·16.
  EXPECT_EQ(line(plan, "attention workspace: masks, rotary tables"), 4 * 2 * 32 * 96 + 32768);
  // Final norm 18,432 + 256 + hidden rows 4·48·72 + targets/weights/slots 20·48 + teacher rows 4·48·72.
  EXPECT_EQ(line(plan, "final norm and the loss's inputs"), 18432 + 256 + 13824 + 960 + 13824);
  // Backward, in the last layer's MLP block, by its closed form on the CPU:
  // the product's gradient, σ, d_up, d_gate and the slope, 5·4·64·100; the
  // down weight's gradient 4·72·100, the hidden-state gradient 4·64·72.
  EXPECT_EQ(line(plan, "backward working memory (largest layer)"), 128000 + 28800 + 18432);
  {
    // layer_ops aten (Hugging Face's op-by-op arithmetic): an rms_norm over
    // [n, D] keeps 8·n·D (its fp32 copy and the normalised tensor).
    nlohmann::json aten_root = root;
    aten_root["drafter"]["layer_ops"] = "aten";
    const memory::DevicePlan aten = train::plan_run(plugins, aten_root);
    // Context: fc input 4·128·72 + norm 8·128·72 + context 4·128·72.
    EXPECT_EQ(line(aten, "drafter context: fc input, fc + norm"), 36864 + 73728 + 36864);
    // Attention: input norm 36,864 + h 18,432 + q's norm and rotated q 12·64·96 + slots' k norm 8·64·32 + slots'
    // k/v 8·64·96 + output and copy 8·64·96 + log-sum-exp 4·6·64 + probabilities 4·6·(2·32·96) + scaled q 4·64·96.
    EXPECT_EQ(line(aten, "drafter layer 0: attention"),
              36864 + 18432 + 73728 + 16384 + 49152 + 49152 + 1536 + 147456 + 24576);
    // Context K/V: k's norm 8·128·32, K and V repeated 8·128·96 (RoPE keeps only its tables).
    EXPECT_EQ(line(aten, "drafter layer 0: context K/V projections"), 32768 + 98304);
    // MLP: post norm 36,864 + m 18,432 + gate, silu, up, product 16·64·100.
    EXPECT_EQ(line(aten, "drafter layer 0: MLP"), 36864 + 18432 + 102400);
    EXPECT_EQ(line(aten, "final norm and the loss's inputs"), 36864 + 13824 + 960 + 13824);
    // Two [Q, I] gradients 8·64·100, the down weight's gradient, the hidden-state gradient.
    EXPECT_EQ(line(aten, "backward working memory (largest layer)"), 51200 + 28800 + 18432);
  }
  {
    // attention_keeps rows: the layer's k and v rows (slots 8·64·32, context
    // 8·128·32) instead of the repeated K/V the math path keeps per call, and
    // no probabilities or scaled q (backward runs each call again).
    nlohmann::json rows_root = root;
    rows_root["drafter"]["attention_keeps"] = "rows";
    const memory::DevicePlan rows = train::plan_run(plugins, rows_root);
    EXPECT_EQ(line(rows, "drafter layer 0: attention"),
              18432 + 256 + 24576 + 1536 + 24576 + 8192 + 512 + 16384 + 49152 + 1536);
    EXPECT_EQ(line(rows, "drafter layer 0: context K/V projections"), 16384 + 1024 + 32768);
    EXPECT_EQ(line(rows, "drafter layer 0: MLP"), 18432 + 256 + 51200);
  }
  // Target forward (ATen path on the CPU): the residual 4·128·72, and the
  // larger of the attention half (norm, qkv, q/k/v after RoPE, output
  // 4·128·488; K/V repeated 2·4·128·96; SDPA math's scores and probabilities
  // 2 rows·6 heads·64²·4·2) and the MLP half 4·128·(72 + 300), the fp32 norm
  // temporaries 8·128·72; angles 8·128·16, cos/sin 4·128·16.
  EXPECT_EQ(line(plan, "target forward working memory"), 36864 + (249856 + 98304 + 393216) + 16384 + 8192);

  // The loss's lines are its own estimate at the drafter's rows.
  host::InstanceOptions options;
  nlohmann::json loss_config = root["loss"];
  loss_config.erase("plugin");
  const host::LossInstance loss(plugins.find(DFLASH_KIND_LOSS, "fused_ckpt_kl"), loss_config, options);
  dflash_loss_shape shape{sizeof(dflash_loss_shape), 48, 72, 301, 0, DFLASH_TEACHER_HIDDEN, 4, 0};
  const auto estimate = loss.estimate_memory(shape);
  ASSERT_TRUE(estimate.has_value());
  EXPECT_EQ(line(plan, "loss: kept for backward"), static_cast<int64_t>(estimate->saved_for_backward_bytes));
  EXPECT_EQ(line(plan, "loss: working memory at its peak"),
            static_cast<int64_t>(estimate->peak_bytes - estimate->saved_for_backward_bytes));

  // Phases: resident = target + drafter weights + AdamW; the step's phases on top.
  const int64_t resident = 204248 * 4 + 45536 * 4 + 2 * 45536 * 4;
  const int64_t activations = 111104 + 349952 + 115712 + 69888 + 57344 + 47296;
  const int64_t features = 4096 + 73728;
  const auto saved = static_cast<int64_t>(estimate->saved_for_backward_bytes);
  EXPECT_EQ(plan.phase_bytes[0], resident + features + 802816);
  EXPECT_EQ(plan.phase_bytes[1], resident + features + activations + static_cast<int64_t>(estimate->peak_bytes));
  EXPECT_EQ(plan.phase_bytes[2], resident + activations + saved + 175232);
  EXPECT_EQ(plan.phase_bytes[3], resident + 45536 * 4 + 144000);
  EXPECT_EQ(plan.peak_bytes, *std::max_element(plan.phase_bytes, plan.phase_bytes + 4));
  EXPECT_EQ(plan.slack_bytes, std::llround(plan.peak_bytes * 0.05));
  EXPECT_EQ(plan.total_bytes, plan.peak_bytes + plan.slack_bytes);
  EXPECT_EQ(plan.facts.at("loss_rows"), 48);
  EXPECT_EQ(plan.facts.at("block_tokens"), 64);
}

memory::PlanInputs synthetic_inputs() {
  memory::PlanInputs in;
  in.device = "cuda:0";
  in.dtype = "bfloat16";
  in.fused_adamw = true;
  in.teacher = false;
  in.data.available = true;
  in.data.facts = {{"rows", 2}, {"row_length", 1000}};
  in.target.available = true;
  in.target.facts = {{"hidden_size", 100}, {"vocab_size", 5000}, {"weights_dtype", "bfloat16"}, {"tied_embeddings", false}};
  in.target.items = {{"target weights", 1000000, DFLASH_MEMORY_RESIDENT}, {"target forward", 30000, DFLASH_MEMORY_TARGET_FORWARD}};
  in.drafter.available = true;
  in.drafter.facts = {{"parameters", 10000}, {"largest_parameter", 4000}, {"target_layer_ids", {1, 2, 3}}, {"loss_rows", 700}};
  in.drafter.items = {{"activations", 200000, DFLASH_MEMORY_ACTIVATIONS}, {"backward", 50000, DFLASH_MEMORY_BACKWARD}};
  in.loss = host::LossMemoryEstimate{9000, 1000};
  return in;
}

TEST(MemoryPlan, PhasesAccumulationPrecisionAndFrozenCopies) {
  memory::PlanInputs in = synthetic_inputs();
  memory::DevicePlan plan = memory::compute_plan(in);
  const int64_t resident = 1000000 + 2 * 10000 + 2 * 2 * 10000;  // target, drafter bf16, two bf16 states
  const int64_t features = 32 * 2000 + 3 * 2000 * 100 * 2;         // batch; 3 feature layers, bf16
  EXPECT_EQ(plan.phase_bytes[0], resident + features + 30000);
  EXPECT_EQ(plan.phase_bytes[1], resident + features + 200000 + 9000);
  EXPECT_EQ(plan.phase_bytes[2], resident + 200000 + 1000 + 50000);
  EXPECT_EQ(plan.phase_bytes[3], resident + 2 * 10000 + 0);  // fused AdamW in bf16 needs no temporaries
  EXPECT_EQ(plan.peak_bytes, plan.phase_bytes[1]);
  EXPECT_EQ(plan.peak_phase, memory::kLossForward);

  // Accumulation keeps the gradients in every phase; fp32 master weights add
  // fp32 masters, fp32 states and the fused kernel's fp32 gradient batch.
  in.grad_accumulation = 4;
  in.fp32_master = true;
  plan = memory::compute_plan(in);
  const int64_t resident2 = 1000000 + 2 * 10000 + 2 * 10000 /* grads */ + 2 * 4 * 10000 + 4 * 10000;
  EXPECT_EQ(plan.phase_bytes[2], resident2 + 200000 + 1000 + 50000);
  EXPECT_EQ(plan.phase_bytes[3], resident2 + 4 * 10000 /* all 10,000 fp32 gradients in one batch */);
  EXPECT_EQ(plan.bytes_of("fp32 master weights"), 4 * 10000);

  // A target in another dtype: the host copies embed, lm_head and the norm.
  in = synthetic_inputs();
  in.target.facts["weights_dtype"] = "float32";
  plan = memory::compute_plan(in);
  EXPECT_EQ(plan.bytes_of("frozen verifier weights"), (2 * 5000 * 100 + 100) * 2);
  in.target.facts["tied_embeddings"] = true;
  EXPECT_EQ(memory::compute_plan(in).bytes_of("frozen verifier weights"), (5000 * 100 + 100) * 2);

  // A plugin that does not plan makes the plan incomplete, and says which.
  in = synthetic_inputs();
  in.drafter.available = false;
  in.drafter_label = "drafter my_drafter";
  plan = memory::compute_plan(in);
  EXPECT_FALSE(plan.complete());
  EXPECT_CONTAINS(plan.missing.front(), "drafter my_drafter does not estimate its memory");
}

// cuBLAS keeps a workspace for every CUDA stream that runs a GEMM: the plan
// counts the training stream's and one per stream the target's forward runs
// on (its fact forward_streams), resident; a drafter rank has only its own;
// none off CUDA (the host passes 0 there).
TEST(MemoryPlan, CountsACublasWorkspacePerGemmStream) {
  memory::PlanInputs in = synthetic_inputs();
  const memory::DevicePlan without = memory::compute_plan(in);
  in.gemm_workspace_bytes = int64_t{32} << 20;
  in.target.facts["forward_streams"] = 2;
  memory::DevicePlan plan = memory::compute_plan(in);
  EXPECT_EQ(plan.bytes_of("cuBLAS workspace of the training stream"), int64_t{32} << 20);
  EXPECT_EQ(plan.bytes_of("cuBLAS workspaces of the target forward's 2 streams"), int64_t{64} << 20);
  for (int phase = 0; phase < 4; ++phase) EXPECT_EQ(plan.phase_bytes[phase], without.phase_bytes[phase] + (int64_t{96} << 20));

  in.role = memory::PlanRole::kDrafterRank;
  const memory::DevicePlan drafter_without = [&] {
    memory::PlanInputs none = in;
    none.gemm_workspace_bytes = 0;
    return memory::compute_plan(none);
  }();
  plan = memory::compute_plan(in);
  EXPECT_EQ(plan.bytes_of("cuBLAS workspaces"), 0);
  EXPECT_EQ(plan.peak_bytes, drafter_without.peak_bytes + (int64_t{32} << 20));

  in = synthetic_inputs();
  in.target.facts["forward_streams"] = 2;  // the CPU: no workspace, no line
  plan = memory::compute_plan(in);
  EXPECT_EQ(plan.bytes_of("cuBLAS"), 0);
  EXPECT_EQ(plan.peak_bytes, without.peak_bytes);
}

// One rank of a data-parallel run: its share of the global batch decides
// whether gradients stay alive across phases; under shard_optimizer its
// AdamW states and masters are about 1/N (at most 1/N + the largest tensor);
// the gradient buckets appear, in fp32 under fp32_master.
TEST(MemoryPlan, OneRankOfSeveralWithAndWithoutAShardedOptimizer) {
  memory::PlanInputs in = synthetic_inputs();
  in.fp32_master = true;
  in.grad_accumulation = 4;
  const memory::DevicePlan alone = memory::compute_plan(in);
  EXPECT_EQ(alone.bytes_of("gradient buckets"), 0) << "one process reduces nothing";
  in.world_size = 4;
  const memory::DevicePlan replicated = memory::compute_plan(in);
  EXPECT_EQ(replicated.world_size, 4);
  EXPECT_EQ(replicated.bytes_of("AdamW states"), alone.bytes_of("AdamW states"));
  EXPECT_EQ(replicated.bytes_of("gradient buckets"), 4 * 10000);
  // One micro-batch per rank: the gradients live only from the backward on.
  EXPECT_EQ(replicated.phase_bytes[1] - alone.phase_bytes[1], -2 * 10000) << "no gradients held through the forward";
  in.shard_optimizer = true;
  const memory::DevicePlan sharded = memory::compute_plan(in);
  const int64_t share = 10000 / 4 + 4000;  // ≤ 1/N + the largest tensor
  EXPECT_EQ(sharded.bytes_of("AdamW states"), 2 * 4 * share);
  EXPECT_EQ(sharded.bytes_of("fp32 master weights"), 4 * share);
  EXPECT_LT(sharded.peak_bytes, replicated.peak_bytes);
  const std::string table = memory::format_plan(sharded, memory::Capacity{}, std::nullopt);
  EXPECT_CONTAINS(table, "one rank of 4");
  EXPECT_CONTAINS(table, "its share under shard_optimizer");
}

// tokens_per_batch = INT64_MAX printed negative byte counts (the products
// wrapped): every figure now saturates, the plan names what overflowed, and
// the table says so instead of printing a wrapped number.
TEST(MemoryPlan, FiguresBeyondInt64SaturateAndTheTableSaysSo) {
  memory::PlanInputs in = synthetic_inputs();
  in.data.facts = {{"rows", INT64_MAX / 1000}, {"row_length", 1000}};
  in.target.items.push_back({"a plugin's own overflow", UINT64_MAX, DFLASH_MEMORY_RESIDENT});
  const memory::DevicePlan plan = memory::compute_plan(in);
  EXPECT_FALSE(plan.representable());
  EXPECT_EQ(plan.bytes_of("batch on the device"), memory::kTooManyBytes);
  EXPECT_EQ(plan.bytes_of("hidden-state items in flight"), memory::kTooManyBytes);
  EXPECT_EQ(plan.bytes_of("a plugin's own overflow"), memory::kTooManyBytes);
  EXPECT_EQ(plan.bytes_of("target weights"), 1000000) << "figures that fit stay exact";
  for (const auto& line : plan.lines) EXPECT_GE(line.bytes, 0) << line.category;
  for (int64_t phase : plan.phase_bytes) EXPECT_EQ(phase, memory::kTooManyBytes) << "every phase holds a saturated line";
  EXPECT_EQ(plan.total_bytes, memory::kTooManyBytes);
  ASSERT_EQ(plan.overflowed.size(), 3u);
  EXPECT_EQ(plan.overflowed[0], "a plugin's own overflow");
  EXPECT_CONTAINS(plan.overflowed[1], "batch on the device");
  EXPECT_CONTAINS(plan.overflowed[2], "hidden-state items in flight");

  memory::Verdict verdict;
  verdict.fits = false;
  verdict.available_bytes = int64_t{1} << 30;
  verdict.short_by = plan.total_bytes - verdict.available_bytes;
  const std::string table = memory::format_plan(plan, memory::Capacity{}, verdict);
  EXPECT_CONTAINS(table, "more than 8 EiB (overflow)");
  EXPECT_CONTAINS(table, "  overflow: a plugin's own overflow; batch on the device");
  EXPECT_CONTAINS(table, "exceed 2^63 bytes, beyond any device: a setting is far too large");
  EXPECT_CONTAINS(table, "verdict: does NOT fit: needs more than any device has (see 'overflow' above), 1.00 GiB available");
  EXPECT_FALSE(std::regex_search(table, std::regex(R"(\s-[0-9])"))) << "a negative figure:\n" << table;
  EXPECT_CONTAINS(table, "allocator slack (5 % of the peak, train.memory_slack): more than 8 EiB (overflow)");
  EXPECT_EQ(memory::plan_to_json(plan, memory::Capacity{}, verdict).at("overflowed").size(), 3u);

  // Sums of lines that each fit overflow too, and are named by their phase.
  in = synthetic_inputs();
  in.target.items = {{"half", uint64_t{INT64_MAX} / 2 + 1, DFLASH_MEMORY_RESIDENT},
                     {"other half", uint64_t{INT64_MAX} / 2 + 1, DFLASH_MEMORY_RESIDENT}};
  const memory::DevicePlan sum = memory::compute_plan(in);
  EXPECT_EQ(sum.bytes_of("half"), int64_t{INT64_MAX} / 2 + 1);
  EXPECT_EQ(sum.total_bytes, memory::kTooManyBytes);
  ASSERT_EQ(sum.overflowed.size(), 1u);
  EXPECT_EQ(sum.overflowed[0], "phase target forward");
}

TEST(MemoryPlan, SizesParseAndBadOnesAreNamed) {
  EXPECT_EQ(memory::parse_size("96GiB"), int64_t{96} << 30);
  EXPECT_EQ(memory::parse_size("80 GB"), int64_t{80000000000});
  EXPECT_EQ(memory::parse_size("1.5TiB"), int64_t{3} << 39);
  EXPECT_EQ(memory::parse_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(memory::parse_size("123456"), 123456);
  for (const char* bad : {"", "GiB", "12 parsecs", "-4GiB", "0"}) {
    try {
      memory::parse_size(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_CONTAINS(e.what(), "is not a memory size");
    }
  }
}

TEST(MemoryPlan, TheProposedSettingsAreTheLargestThatFit) {
  const host::PluginRegistry plugins = registry();
  const nlohmann::json root = with_defaults(plugins, small_root());
  const memory::DevicePlan plan = train::plan_run(plugins, root);
  // Just short: less than the drafter's step is above the target's forward
  // (the next phase down), so fewer anchors alone can close it.
  const int64_t short_by = 60000;
  const int64_t available = plan.total_bytes - short_by;
  const memory::Verdict verdict = train::check_fit(plugins, root, plan, available);
  EXPECT_FALSE(verdict.fits);
  EXPECT_EQ(verdict.short_by, short_by);
  bool anchors = false, budget = false;
  for (const auto& s : verdict.suggestions) {
    nlohmann::json candidate = root;
    candidate[s.section][s.key] = s.value;
    EXPECT_LE(train::plan_run(plugins, candidate).total_bytes, available) << s.override_flag() << " fits";
    if (s.current > 0) EXPECT_LT(s.value, s.current);  // 0 is "automatic" for a loss's chunk size
    if (s.key == "max_anchors") {
      anchors = true;
      EXPECT_EQ(s.label, "anchor count");
      candidate[s.section][s.key] = s.value + 1;
      EXPECT_GT(train::plan_run(plugins, candidate).total_bytes, available) << "one more anchor does not fit";
      EXPECT_EQ(s.override_flag(), "--set drafter.max_anchors=" + std::to_string(s.value));
    }
    if (s.key == "tokens_per_batch") {
      budget = true;
      EXPECT_EQ(s.value % 64, 0) << "the data source's effective budget: whole rows";
    }
  }
  EXPECT_TRUE(anchors);
  EXPECT_TRUE(budget);
  EXPECT_TRUE(train::check_fit(plugins, root, plan, plan.total_bytes).fits);
}

TEST(MemoryPlan, ACPluginPlansThroughTheAbiAndOneWithoutThePlanSlotSaysSo) {
  const host::PluginRegistry plugins = registry();
  host::InstanceOptions options;
  const auto c_plan = host::plan_memory(plugins.find(DFLASH_KIND_DATA_SOURCE, "c_data"), nlohmann::json::object(), options,
                                        nlohmann::json::object());
  ASSERT_TRUE(c_plan.available);
  EXPECT_EQ(c_plan.facts.at("rows"), 2);
  EXPECT_EQ(c_plan.facts.at("row_length"), 3);
  ASSERT_EQ(c_plan.items.size(), 1u);
  EXPECT_EQ(c_plan.items[0].category, "c_data prefetch buffer");
  const auto none = host::plan_memory(plugins.find(DFLASH_KIND_TARGET_MODEL, "test_target"), nlohmann::json::object(),
                                      options, nlohmann::json::object());
  EXPECT_FALSE(none.available);
  // A plugin's own refusal names the plugin and the key.
  nlohmann::json bad = with_defaults(plugins, small_root())["data"];
  bad.erase("plugin");
  bad["tokens_per_batch"] = 10;
  try {
    host::plan_memory(plugins.find(DFLASH_KIND_DATA_SOURCE, "synthetic"), bad, options, nlohmann::json::object());
    FAIL();
  } catch (const host::PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "data source plugin 'synthetic'");
    EXPECT_CONTAINS(e.what(), "data.synthetic.tokens_per_batch: must be at least row_length (64)");
  }
}

// train.device "cuda" names cuda:0: the target's frozen weights already there
// are shared, not copied (a copy of a 248k × 5120 embedding and lm_head cost
// 4.7 GiB on the H200 before this was fixed; docs/memory.md).
TEST(MemoryPlan, CudaWithoutAnIndexIsTheSameDeviceAsCuda0) {
  EXPECT_TRUE(host::same_device(c10::Device("cuda"), c10::Device("cuda:0")));
  EXPECT_TRUE(host::same_device(c10::Device("cuda:0"), c10::Device("cuda")));
  EXPECT_FALSE(host::same_device(c10::Device("cuda"), c10::Device("cuda:1")));
  EXPECT_FALSE(host::same_device(c10::Device("cpu"), c10::Device("cuda")));
  EXPECT_TRUE(host::same_device(c10::Device("cpu"), c10::Device("cpu")));
}

TEST(MemoryPlan, FrozenWeightsOnTheCurrentCudaDeviceAreSharedNotCopied) {
  if (!at::globalContext().hasCUDA()) GTEST_SKIP() << "needs a CUDA device";
  const auto options = at::TensorOptions().device(c10::Device("cuda:0")).dtype(at::kBFloat16);
  const host::NamedTensors target = {{"embed_tokens", at::ones({8, 4}, options)},
                                     {"lm_head", at::ones({8, 4}, options)},
                                     {"final_norm", at::ones({4}, options)}};
  for (const char* device : {"cuda", "cuda:0"}) {
    const host::NamedTensors placed = host::place_frozen_weights(target, "t", c10::Device(device), at::kBFloat16);
    for (size_t i = 0; i < placed.size(); ++i)
      EXPECT_EQ(placed[i].second.data_ptr(), target[i].second.data_ptr()) << device << " " << placed[i].first;
  }
  const host::NamedTensors fp32 = host::place_frozen_weights(target, "t", c10::Device("cuda"), at::kFloat);
  EXPECT_NE(fp32[1].second.data_ptr(), target[1].second.data_ptr()) << "another dtype is a copy";
}

// ---- dflash-host plan / train ---------------------------------------------------

struct Result {
  int status;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Result host_run(const std::string& args, const std::string& scratch) {
  const std::string command = std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs --plugin-dir " +
                              DFLASH_INTREE_PLUGIN_DIR + " --plugin-dir " + DFLASH_GOOD_PLUGIN_DIR + " " + args + " > " +
                              scratch + "/out.txt 2> " + scratch + "/err.txt";
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(scratch + "/out.txt"), slurp(scratch + "/err.txt")};
}

std::string write_config(const std::string& dir, const nlohmann::json& root) {
  const std::string path = dir + "/config.json";
  std::ofstream(path) << root.dump(2);
  return path;
}

// A CPU run's planned peak (metrics.jsonl's memory_planned_peak_bytes)
// within ±10 % of its largest measured one (counted tensor bytes).
void expect_planned_within_ten_percent(const std::string& run, const std::string& what) {
  std::ifstream metrics(run + "/metrics.jsonl");
  int64_t measured = 0, planned = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (!record.contains("memory_peak_bytes")) continue;
    EXPECT_EQ(record.at("memory_source"), "cpu_allocator");
    measured = std::max(measured, record.at("memory_peak_bytes").get<int64_t>());
    planned = record.at("memory_planned_peak_bytes").get<int64_t>();
  }
  ASSERT_GT(measured, 0) << what;
  const double ratio = static_cast<double>(planned) / static_cast<double>(measured);
  EXPECT_GT(ratio, 0.9) << what << ": planned " << planned << " bytes, measured " << measured;
  EXPECT_LT(ratio, 1.1) << what << ": planned " << planned << " bytes, measured " << measured;
  std::printf("[ plan     ] %s: planned %.1f MiB, measured %.1f MiB (%.3f)\n", what.c_str(), planned / 1048576.0,
              measured / 1048576.0, ratio);
}

// On the CPU dflash-host counts tensor bytes as LibTorch allocates them
// (memory/cpu_tensor_bytes.h), so a CPU run's measured peak is what the
// planner predicts, not the process's resident set. The quickstart's shape
// and variations of it: the planned step peak within ±10 % of the measured
// one. Block 16 and 32 run the block layout by its ATen reference; 8
// anchors peak in the target's forward.
TEST(PlanCommand, ACpuRunsMeasuredPeakIsTensorBytesWithinTenPercentOfThePlan) {
  struct Variant {
    const char* what;
    std::string settings;
  };
  const std::string source = DFLASH_SOURCE_DIR;
  for (const Variant& v : {Variant{"the quickstart", ""}, Variant{"4 drafter layers", " --set drafter.num_layers=4"},
                           Variant{"fp32 masters, 2 batches a step", " --set train.precision=fp32_master"
                                                                     " --set train.grad_accumulation=2"},
                           Variant{"the kl loss", " --set loss.plugin=kl"},
                           Variant{"4 × the tokens", " --set data.tokens_per_batch=8192"},
                           Variant{"block 16", " --set drafter.block_size=16"},
                           Variant{"block 32, 16 anchors", " --set drafter.block_size=32 --set drafter.max_anchors=16"},
                           Variant{"grouped attention, block 16", " --set drafter.attention=grouped --set drafter.block_size=16"},
                           Variant{"op-by-op layers", " --set drafter.layer_ops=aten"},
                           Variant{"8 anchors", " --set drafter.max_anchors=8"}}) {
    SCOPED_TRACE(v.what);
    test::TempDir temp("dflash_cpu_peak");
    const std::string dir = temp.path().string();
    const Result run = host_run("--config " + source + "/configs/quickstart.json --set train.steps=2 --set train.output_dir=" +
                                    dir + "/run --set train.eval_every=0 --set train.checkpoint_every=0"
                                    " --set data.path=" + source + "/configs/quickstart/data/train.jsonl"
                                    " --set target.path=" + source + "/configs/quickstart/target" + v.settings,
                                dir);
    ASSERT_EQ(run.status, 0) << run.err;
    expect_planned_within_ten_percent(dir + "/run", v.what);
  }
}

// The same for the eagle3 drafter (its plan_memory, eagle3/memory_model.h):
// the quickstart's data and target, a 200-token draft vocabulary from the
// data's counts, fused and op-by-op layer ops, 3 and 7 TTT steps, 4 × the
// tokens. On the CPU its attention is the chunked form, whose backward
// holds a chunk's scores: counted too.
TEST(PlanCommand, AnEagle3CpuRunsMeasuredPeakIsWithinTenPercentOfThePlan) {
  const std::string source = DFLASH_SOURCE_DIR;
  test::TempDir temp("dflash_cpu_peak_eagle3");
  const std::string dir = temp.path().string();
  const std::string data = " --set data.path=" + source + "/configs/quickstart/data/train.jsonl --set target.path=" + source +
                           "/configs/quickstart/target";
  const Result counts = host_run("token-counts --config " + source + "/configs/quickstart.json" + data + " --out " + dir +
                                     "/counts.json",
                                 dir);
  ASSERT_EQ(counts.status, 0) << counts.err;
  struct Variant {
    const char* what;
    std::string settings;
  };
  for (const Variant& v : {Variant{"the defaults (7 steps, fused)", ""}, Variant{"op-by-op layers", " --set drafter.layer_ops=aten"},
                           Variant{"3 TTT steps", " --set drafter.ttt_steps=3"},
                           Variant{"4 × the tokens", " --set data.tokens_per_batch=8192"}}) {
    SCOPED_TRACE(v.what);
    std::filesystem::remove_all(dir + "/run");
    const Result run = host_run("--config " + source + "/configs/quickstart.json --drafter eagle3 --set drafter.token_counts=" +
                                    dir + "/counts.json --set drafter.draft_vocab_size=200 --set train.steps=2"
                                    " --set train.output_dir=" + dir + "/run --set train.eval_every=0"
                                    " --set train.checkpoint_every=0" + data + v.settings,
                                dir);
    ASSERT_EQ(run.status, 0) << run.err;
    expect_planned_within_ten_percent(dir + "/run", std::string("eagle3, ") + v.what);
  }
}

// plan --loss NAME --rows N --vocab V: a loss alone, no config, target or
// drafter. Its figures are the loss's own estimate_memory at that shape (in
// the dtype --set gives), beside the full logits; a chunked loss stays well
// under them at a large vocabulary, and what is missing is named.
TEST(PlanCommand, PlansALossAloneAtRowsTimesVocabWithoutATarget) {
  test::TempDir temp("dflash_plan_loss");
  const std::string dir = temp.path().string();
  const Result alone = host_run("plan --loss fused_ckpt_kl --rows 65536 --vocab 151936 --hidden 4096 "
                                "--set train.dtype=bfloat16 --set loss.kl_weight=0.5 --json", dir);
  ASSERT_EQ(alone.status, 0) << alone.err;
  const nlohmann::json got = nlohmann::json::parse(alone.out);
  const host::PluginRegistry plugins = registry();
  const host::PluginRecord& record = plugins.find(DFLASH_KIND_LOSS, "fused_ckpt_kl");
  nlohmann::json settings = config::defaults_of(record.schema);
  settings["kl_weight"] = 0.5;
  host::InstanceOptions options;
  options.dtype = "bfloat16";
  const host::LossInstance loss(record, settings, options);
  const dflash_loss_shape shape{sizeof(dflash_loss_shape), 65536, 4096, 151936, 0, DFLASH_TEACHER_HIDDEN, 2, 0};
  const auto estimate = loss.estimate_memory(shape);
  ASSERT_TRUE(estimate.has_value());
  EXPECT_EQ(got.at("peak_bytes").get<uint64_t>(), estimate->peak_bytes);
  EXPECT_EQ(got.at("saved_for_backward_bytes").get<uint64_t>(), estimate->saved_for_backward_bytes);
  EXPECT_EQ(got.at("full_logits_bytes").get<int64_t>(), int64_t{65536} * 151936 * 2);
  EXPECT_LT(got.at("peak_bytes").get<int64_t>(), got.at("full_logits_bytes").get<int64_t>() / 2) << "chunked: well under";
  const Result table = host_run("plan --loss ce --rows 64 --vocab 1000", dir);
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_CONTAINS(table.out, "alone: 64 rows, vocabulary 1000, hidden 4096, float32 on cpu");
  EXPECT_CONTAINS(table.out, "working memory at its peak");
  EXPECT_CONTAINS(host_run("plan --rows 64 --vocab 1000", dir).err, "plan --rows plans a loss alone: name it with --loss NAME");
  EXPECT_CONTAINS(host_run("plan --loss ce --rows 64", dir).err, "give the vocabulary with --vocab V");
  EXPECT_CONTAINS(host_run("plan --loss ce --vocab 64", dir).err, "give --rows too");
  EXPECT_CONTAINS(host_run("plan --loss ce --rows 0 --vocab 64", dir).err, "--rows is 0; give at least 1");
  // A C loss with no estimate_memory (tests/fixtures/plugins/broken's valid one, "twin").
  const std::string twin = std::string(" --plugin-dir ") + DFLASH_BROKEN_PLUGIN_DIR + "/twin_a";
  EXPECT_CONTAINS(host_run("plan --loss twin --rows 8 --vocab 64" + twin, dir).err,
                  "loss plugin 'twin' (" );
  EXPECT_CONTAINS(host_run("plan --loss twin --rows 8 --vocab 64" + twin, dir).err, "does not estimate its memory");
}

TEST(PlanCommand, PrintsTheTableComparesWithTheDeviceAndProposesSettings) {
  test::TempDir temp("dflash_plan");
  const std::string dir = temp.path().string();
  const std::string config = write_config(dir, small_root(dir + "/run"));
  const Result fits = host_run("plan --config " + config + " --gpu-memory 1GiB", dir);
  ASSERT_EQ(fits.status, 0) << fits.err;
  for (const char* part : {"target weights (4 layers, float32)", "drafter layer 0: attention", "drafter layer 0: MLP",
                           "context K/V projections", "attention workspace", "AdamW states", "loss: kept for backward",
                           "hidden-state items in flight", "allocator slack", "predicted peak", "verdict: fits",
                           "1.00 GiB available of 1.00 GiB (--gpu-memory)"})
    EXPECT_CONTAINS(fits.out, part);
  const Result json = host_run("plan --json --config " + config + " --gpu-memory 1GiB", dir);
  ASSERT_EQ(json.status, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_TRUE(j.at("verdict").at("fits").get<bool>());
  EXPECT_EQ(j.at("total_bytes").get<int64_t>(), j.at("peak_bytes").get<int64_t>() + j.at("slack_bytes").get<int64_t>());

  const Result short_of = host_run("plan --config " + config + " --gpu-memory 2.4MiB", dir);
  EXPECT_EQ(short_of.status, 6) << short_of.err;
  EXPECT_CONTAINS(short_of.out, "verdict: does NOT fit");
  EXPECT_CONTAINS(short_of.out, "short by");
  EXPECT_CONTAINS(short_of.out, "--set drafter.max_anchors=");
  EXPECT_CONTAINS(short_of.out, "anchor count, now 8");
  const Result bad_size = host_run("plan --config " + config + " --gpu-memory lots", dir);
  EXPECT_EQ(bad_size.status, 2);
  EXPECT_CONTAINS(bad_size.err, "'lots' is not a memory size");
}

TEST(PlanCommand, TrainRefusesARunThatDoesNotFitUnlessForced) {
  test::TempDir temp("dflash_plan_train");
  const std::string dir = temp.path().string();
  nlohmann::json root = small_root(dir + "/run");
  root["train"]["steps"] = 2;
  const std::string config = write_config(dir, root);
  const Result refused = host_run("--config " + config + " --gpu-memory 2MiB", dir);
  EXPECT_EQ(refused.status, 6) << refused.err;
  EXPECT_CONTAINS(refused.err, "verdict: does NOT fit");
  EXPECT_CONTAINS(refused.err, "the run does not fit on cpu");
  EXPECT_CONTAINS(refused.err, "--skip-memory-check");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run")) << "nothing was created for a run that cannot fit";
  const Result forced = host_run("--config " + config + " --gpu-memory 2MiB --skip-memory-check", dir);
  EXPECT_EQ(forced.status, 0) << forced.err;
  EXPECT_CONTAINS(forced.err, "starting anyway (--skip-memory-check)");
  // Every step's record carries the allocator's figures and the plan's peak.
  std::ifstream metrics(dir + "/run/metrics.jsonl");
  std::string first;
  ASSERT_TRUE(std::getline(metrics, first));
  const auto record = nlohmann::json::parse(first);
  for (const char* key : {"memory_current_bytes", "memory_peak_bytes", "memory_planned_peak_bytes"})
    EXPECT_TRUE(record.contains(key)) << key;
}

// tokens_per_batch = INT64_MAX: `plan` printed negative byte counts. Now it
// says the figures overflow, does not fit, and proposes a budget that does.
// The seed's 3-target + 1-drafter case (recipe.md): a Qwen3.6-27B-shaped
// target (64 layers, H 5120, V 248,320: its config and placeholder tensor
// names, no weights), the 27B drafter (5 layers, 128 anchors × 16 per row, no
// activation checkpointing), 65,536 tokens per batch, queue depth 5, cards
// of 96 GiB. The drafter rank does not fit; the plan says so by category
// and proposes the largest token budget that does, before anything trains.
std::string seed_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path model = fs::path(dir) / "qwen3.6-27b-shape";
  fs::create_directories(model);
  std::ofstream(model / "config.json") << nlohmann::json{
      {"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"num_hidden_layers", 64}, {"hidden_size", 5120},
      {"intermediate_size", 17408}, {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"head_dim", 128},
      {"vocab_size", 248320}, {"max_position_embeddings", 65536}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1e6},
      {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}}.dump(2);
  // The planner reads tensor names only (is there an lm_head, q/k/v biases?).
  sdk::safetensors::save_tensors(model / "model.safetensors", {{"model.embed_tokens.weight", at::zeros({1}, at::kBFloat16)},
                                                               {"lm_head.weight", at::zeros({1}, at::kBFloat16)}});
  nlohmann::json root = {
      {"train", {{"device", "cuda"}, {"dtype", "bfloat16"}, {"steps", 1000}, {"grad_accumulation", 3},
                 {"output_dir", dir + "/run"}, {"progress", "lines"}}},
      {"data", {{"plugin", "synthetic"}, {"row_length", 4096}, {"tokens_per_batch", 65536}}},
      {"target", {{"plugin", "hf_decoder"}, {"path", model.string()}}},
      // The op-by-op layers (Hugging Face's arithmetic, as the seed's trainer
      // ran them); the default fused layer ops fit this split (below).
      {"drafter", {{"plugin", "dflash"}, {"num_layers", 5}, {"block_size", 16}, {"max_anchors", 128}, {"layer_ops", "aten"}}},
      {"loss", {{"plugin", "fused_ckpt_kl"}, {"kl_weight", 0.5}}},
      {"scheduler", {{"plugin", "warmup_cosine"}}}};
  return write_config(dir, root);
}

TEST(PlanCommand, TheSeedsThreeTargetOneDrafterSplitIsRefusedWithTheTokenBudgetThatFits) {
  test::TempDir temp("dflash_plan_seed");
  const std::string dir = temp.path().string();
  const std::string config = seed_config(dir);
  const std::string seed = "plan --json --config " + config + " --gpu-memory 96GiB --queue-depth 5";
  const Result r = host_run(seed + " --target-ranks 3 --drafter-ranks 1 --tokens-per-batch 65536", dir);
  ASSERT_EQ(r.status, 6) << r.err << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const auto& target = j.at("roles").at("target rank");
  const auto& drafter = j.at("roles").at("drafter rank");
  auto line_of = [](const nlohmann::json& plan, const std::string& prefix) -> int64_t {
    for (const auto& l : plan.at("lines"))
      if (l.at("category").get<std::string>().rfind(prefix, 0) == 0) return l.at("bytes").get<int64_t>();
    return -1;
  };
  // By hand: an item is the 5 fed layers and the teacher's last hidden state,
  // 6 × 65,536 tokens × 5,120 × 2 bytes (bf16).
  const int64_t item = int64_t{6} * 65536 * 5120 * 2;
  EXPECT_EQ(drafter.at("item_bytes").get<int64_t>(), item);
  EXPECT_EQ(line_of(drafter, "hidden-state items queued: 5 × 6 × [16, 4096, 5120]"), 5 * item) << "18.75 GiB";
  EXPECT_EQ(line_of(target, "hidden-state items in flight: 1 × 6 × [16, 4096, 5120]"), item) << "3.75 GiB";
  // The frozen embed_tokens and lm_head (untied) and final_norm, copied to the drafter rank.
  EXPECT_EQ(line_of(drafter, "frozen verifier weights"), (int64_t{2} * 248320 * 5120 + 5120) * 2);
  // Each role holds its own: no drafter on a target rank, no target on a drafter rank.
  EXPECT_EQ(line_of(target, "drafter weights"), -1);
  EXPECT_EQ(line_of(target, "AdamW states"), -1);
  EXPECT_EQ(line_of(target, "loss:"), -1);
  EXPECT_EQ(line_of(drafter, "target weights"), -1);
  const int64_t parameters = drafter.at("facts").at("drafter_parameters").get<int64_t>();
  EXPECT_EQ(line_of(drafter, "AdamW states"), 2 * parameters * 2);
  EXPECT_EQ(line_of(drafter, "drafter weights"), parameters * 2);
  EXPECT_TRUE(target.at("verdict").at("fits").get<bool>());
  EXPECT_FALSE(drafter.at("verdict").at("fits").get<bool>());
  // The largest token budget that fits, proposed; it fits, one row more does not.
  int64_t budget = 0;
  for (const auto& s : drafter.at("verdict").at("suggestions"))
    if (s.at("key") == "tokens_per_batch") budget = s.at("value").get<int64_t>();
  ASSERT_GT(budget, 0) << drafter.at("verdict").dump();
  EXPECT_LT(budget, 65536);
  EXPECT_EQ(budget % 4096, 0) << "whole rows of 4,096";
  const Result at_budget = host_run(seed + " --target-ranks 3 --drafter-ranks 1 --tokens-per-batch " + std::to_string(budget), dir);
  EXPECT_EQ(at_budget.status, 0) << at_budget.out;
  const Result one_row_more =
      host_run(seed + " --target-ranks 3 --drafter-ranks 1 --tokens-per-batch " + std::to_string(budget + 4096), dir);
  EXPECT_EQ(one_row_more.status, 6);
  // The deepest queue that fits is proposed too (the host's own knob).
  int64_t depth = 0;
  for (const auto& sg : drafter.at("verdict").at("suggestions"))
    if (sg.at("key") == "queue_depth") depth = sg.at("value").get<int64_t>();
  ASSERT_GE(depth, 1) << drafter.at("verdict").dump();
  const std::string budget_65k = " --target-ranks 3 --drafter-ranks 1 --tokens-per-batch 65536";
  EXPECT_EQ(host_run("plan --config " + config + " --gpu-memory 96GiB --queue-depth " + std::to_string(depth) + budget_65k, dir).status, 0);
  EXPECT_EQ(host_run("plan --config " + config + " --gpu-memory 96GiB --queue-depth " + std::to_string(depth + 1) + budget_65k, dir).status, 6);
  // With the fused layer ops (the default) the drafter keeps less per token
  // and the seed's split fits as asked.
  const Result fused = host_run(seed + budget_65k + " --set drafter.layer_ops=fused", dir);
  EXPECT_EQ(fused.status, 0) << fused.out;
  EXPECT_TRUE(nlohmann::json::parse(fused.out).at("roles").at("drafter rank").at("verdict").at("fits").get<bool>());
  // The queue is bounded by its depth, not by the number of target ranks.
  const Result two_two = host_run(seed + " --target-ranks 2 --drafter-ranks 2 --tokens-per-batch 65536", dir);
  const auto j2 = nlohmann::json::parse(two_two.out);
  EXPECT_EQ(line_of(j2.at("roles").at("drafter rank"), "hidden-state items queued"), 5 * item);
  // The table a person reads names the split and the categories.
  const Result table = host_run("plan --config " + config + " --gpu-memory 96GiB --tokens-per-batch 65536 --queue-depth 5 "
                                "--target-ranks 3 --drafter-ranks 1", dir);
  EXPECT_EQ(table.status, 6);
  const std::vector<std::string> parts = {"disaggregated: 3 target + 1 drafter ranks, queue_depth 5",
                                         "memory plan for cuda (target rank)", "memory plan for cuda (drafter rank)",
                                         "received from target rank 0", "18.75 GiB", "verdict: does NOT fit",
                                         "--set data.tokens_per_batch=" + std::to_string(budget)};
  for (const std::string& part : parts)
    EXPECT_CONTAINS(table.out, part);
}

// The seed's case with its real target: Qwen3.6-27B as its folder ships
// (multimodal config.json, the text model under text_config: 48 Gated
// DeltaNet + 16 gated full-attention layers, H 5120, V 248,320), its config
// and placeholder tensor names only (the planner reads names, not weights),
// planned by hf_hybrid. The target rank's lines are its real weights and its
// linear layers' working memory; the drafter rank's item is the same
// [16, 4096, 5120] × 6 as for any target of that width.
std::string seed_config_hybrid(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path model = fs::path(dir) / "qwen3.6-27b";
  fs::create_directories(model);
  nlohmann::json types = nlohmann::json::array();
  for (int i = 0; i < 64; ++i) types.push_back(i % 4 == 3 ? "full_attention" : "linear_attention");
  std::ofstream(model / "config.json") << nlohmann::json{
      {"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"}, {"tie_word_embeddings", false},
      {"text_config",
       {{"model_type", "qwen3_5_text"}, {"hidden_size", 5120}, {"intermediate_size", 17408}, {"num_hidden_layers", 64},
        {"layer_types", types}, {"num_attention_heads", 24}, {"num_key_value_heads", 4}, {"head_dim", 256},
        {"linear_num_key_heads", 16}, {"linear_num_value_heads", 48}, {"linear_key_head_dim", 128},
        {"linear_value_head_dim", 128}, {"linear_conv_kernel_dim", 4}, {"vocab_size", 248320},
        {"max_position_embeddings", 262144}, {"rms_norm_eps", 1e-6}, {"eos_token_id", 248044},
        {"attn_output_gate", true}, {"dtype", "bfloat16"},
        {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000}, {"partial_rotary_factor", 0.25},
                             {"mrope_section", {11, 11, 10}}, {"mrope_interleaved", true}}}}},
      {"vision_config", {{"depth", 27}}}}.dump(2);
  sdk::safetensors::save_tensors(model / "model.safetensors",
                                 {{"model.language_model.embed_tokens.weight", at::zeros({1}, at::kBFloat16)},
                                  {"lm_head.weight", at::zeros({1}, at::kBFloat16)}});
  nlohmann::json root = {
      {"train", {{"device", "cuda"}, {"dtype", "bfloat16"}, {"steps", 1000}, {"grad_accumulation", 3},
                 {"output_dir", dir + "/run"}, {"progress", "lines"}}},
      {"data", {{"plugin", "synthetic"}, {"row_length", 4096}, {"tokens_per_batch", 65536}}},
      {"target", {{"plugin", "hf_hybrid"}, {"path", model.string()}}},
      {"drafter", {{"plugin", "dflash"}, {"num_layers", 5}, {"block_size", 16}, {"max_anchors", 128}, {"layer_ops", "aten"}}},
      {"loss", {{"plugin", "fused_ckpt_kl"}, {"kl_weight", 0.5}}},
      {"scheduler", {{"plugin", "warmup_cosine"}}}};
  return write_config(dir, root);
}

TEST(PlanCommand, TheSeedsCaseWithItsRealHybridTarget) {
  test::TempDir temp("dflash_plan_seed_hybrid");
  const std::string dir = temp.path().string();
  const std::string config = seed_config_hybrid(dir);
  const Result r = host_run("plan --json --config " + config + " --gpu-memory 96GiB --queue-depth 5 --target-ranks 3 "
                            "--drafter-ranks 1 --tokens-per-batch 65536", dir);
  ASSERT_TRUE(r.status == 0 || r.status == 6) << r.err << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const auto& target = j.at("roles").at("target rank");
  const auto& drafter = j.at("roles").at("drafter rank");
  auto line = [](const nlohmann::json& plan, const std::string& prefix) -> int64_t {
    for (const auto& l : plan.at("lines"))
      if (l.at("category").get<std::string>().rfind(prefix, 0) == 0) return l.at("bytes").get<int64_t>();
    return -1;
  };
  // The weights by hand, from the architecture (bf16; the (1 + w) norms fp32):
  const int64_t h = 5120, vocab = 248320, inter = 17408;
  const int64_t linear = (2 * 16 * 128 + 48 * 128 + 48 * 128 + 2 * 48) * h  // in_proj_qkv, z, b, a
                         + (2 * 16 * 128 + 48 * 128) * 4          // conv1d
                         + 2 * 48 + 128                           // A_log, dt_bias, the gated norm
                         + h * 48 * 128;                          // out_proj
  const int64_t full = (2 * 24 * 256 + 2 * 4 * 256) * h + h * 24 * 256;  // q (with gate), k, v; o
  const int64_t mlp = 3 * inter * h;
  const int64_t bf16 = 2 * vocab * h + 48 * linear + 16 * full + 64 * mlp;
  const int64_t fp32 = h + 64 * 2 * h + 16 * 2 * 256;
  EXPECT_EQ(line(target, "target weights (64 layers: 48 linear, 16 full attention; bfloat16)"), 2 * bf16 + 4 * fp32)
      << target.dump(1);
  EXPECT_NEAR(static_cast<double>(bf16), 26.9e9, 0.05e9) << "Qwen3.6-27B's parameter count";
  // The forward's working memory (16 rows of 4,096 tokens per target
  // forward; bf16 on CUDA, so the delta rule, the norms and SwiGLU run in
  // CUDA kernels): the largest stage is a full-attention layer's — its
  // input, q/gate/k/v, five [tokens, 24 × 256] tensors, the document mask's
  // row, an fp32 norm temporary — above a Gated DeltaNet layer's (input,
  // projections, conv output, the kernels' workspace, g and β in fp32, the
  // rule's output) and the MLP's (input, gate_up, SwiGLU).
  const int64_t full_stage = 2 * (h + (2 * 24 + 2 * 4) * 256 + 5 * 24 * 256 + 4096) + 4 * 24 * 256;
  const int64_t linear_stage = 2 * (h + 16480 + 10240) + 2 * 48 * (3 * 128 + 128 + 64) + 8 * 48 + 2 * 48 * 128;
  const int64_t mlp_stage = 2 * (h + 3 * inter);
  ASSERT_GT(full_stage, std::max(linear_stage, mlp_stage));
  const int64_t per_token = 2 * 2 * h + full_stage;
  EXPECT_EQ(line(target, "target forward working memory"), int64_t{65536} * per_token);
  // The plugin's facts, with the plan: what decoding keeps per session (the
  // linear layers' fp32 states and conv windows, whatever the length, two of
  // each: the current and the one before the last step) and per token (the
  // full layers' KV).
  const auto& facts = target.at("facts").at("target");
  EXPECT_EQ(facts.at("layer_types").size(), 64u);
  EXPECT_EQ(facts.at("decode_state_bytes_per_session").get<int64_t>(), 2 * 48 * (4 * 48 * 128 * 128 + 2 * 3 * 10240));
  EXPECT_EQ(facts.at("decode_kv_bytes_per_token").get<int64_t>(), 16 * 2 * 4 * 256 * 2);
  EXPECT_EQ(facts.at("default_layer_ids"), nlohmann::json({1, 16, 31, 46, 61}));
  EXPECT_FALSE(drafter.at("facts").contains("target")) << "a drafter rank holds no target";
  EXPECT_TRUE(target.at("verdict").at("fits").get<bool>()) << target.dump(1);
  // The drafter rank's item: the 5 fed layers and the last hidden state.
  EXPECT_EQ(drafter.at("item_bytes").get<int64_t>(), int64_t{6} * 65536 * 5120 * 2);
  EXPECT_EQ(line(drafter, "frozen verifier weights"), (int64_t{2} * vocab * h + h) * 2);
}

// `plan --calibrate N` times the two sides on this device and forecasts
// every split of the world by the model it states (calibration.h).
TEST(PlanCommand, CalibrationTimesBothSidesAndForecastsEverySplit) {
  test::TempDir temp("dflash_plan_calibrate");
  const std::string dir = temp.path().string();
  const std::string config = write_config(dir, small_root(dir + "/run"));
  const Result r = host_run("plan --json --config " + config + " --gpu-memory 1GiB --target-ranks 1 --drafter-ranks 3 "
                            "--calibrate 2 --set train.grad_accumulation=6", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto t = nlohmann::json::parse(r.out).at("throughput");
  EXPECT_EQ(t.at("batches"), 2);
  EXPECT_EQ(t.at("tokens_per_batch").get<double>(), 128.0) << "2 rows × 64 tokens";
  const double target = t.at("target_seconds_per_batch"), drafter = t.at("drafter_seconds_per_batch"),
               optimizer = t.at("optimizer_seconds");
  EXPECT_GT(target, 0);
  EXPECT_GT(drafter, 0);
  EXPECT_GT(optimizer, 0);
  const auto& splits = t.at("splits");
  ASSERT_EQ(splits.size(), 3u) << "1 + 3, 2 + 2, 3 + 1";
  for (size_t i = 0; i < splits.size(); ++i) {
    const auto& f = splits[i];
    const int T = f.at("target_ranks"), D = f.at("drafter_ranks");
    EXPECT_EQ(T + D, 4);
    // The stated model: per step ⌈6/T⌉ forwards on a target rank, ⌈6/D⌉
    // drafter passes and one optimizer step on a drafter rank; the slower sets the pace.
    const double target_rate = 6 * 128 / (std::ceil(6.0 / T) * target);
    const double drafter_rate = 6 * 128 / (std::ceil(6.0 / D) * drafter + optimizer);
    EXPECT_NEAR(f.at("target_tokens_per_s").get<double>(), target_rate, 1e-9 * target_rate);
    EXPECT_NEAR(f.at("drafter_tokens_per_s").get<double>(), drafter_rate, 1e-9 * drafter_rate);
    EXPECT_NEAR(f.at("tokens_per_s").get<double>(), std::min(target_rate, drafter_rate), 1e-9 * target_rate);
    EXPECT_EQ(f.at("bound"), target_rate < drafter_rate ? "target" : "drafter");
    if (i > 0) EXPECT_GE(splits[i - 1].at("tokens_per_s").get<double>(), f.at("tokens_per_s").get<double>()) << "fastest first";
  }
  EXPECT_EQ(t.at("this_split").at("target_ranks"), 1);
  const Result text = host_run("plan --config " + config + " --gpu-memory 1GiB --target-ranks 1 --drafter-ranks 3 "
                               "--calibrate 1 --set train.grad_accumulation=6", dir);
  ASSERT_EQ(text.status, 0) << text.err;
  for (const char* part : {"throughput, measured on cpu over 1 batches of 128 tokens", "a target rank:", "a drafter rank:",
                           "1 + 3 (this)", "2 + 2", "3 + 1", "transfers and the drafter ranks' gradient reduction left out"})
    EXPECT_CONTAINS(text.out, part);
  const Result bad = host_run("plan --config " + config + " --target-ranks 1 --drafter-ranks 1 --calibrate 0", dir);
  EXPECT_EQ(bad.status, 2);
  EXPECT_CONTAINS(bad.err, "--calibrate 0: expected a number of batches from 1 to 1000");
}

TEST(PlanCommand, AnOverflowingTokenBudgetIsRefusedAndTheLargestOneIsPlannedSanely) {
  test::TempDir temp("dflash_plan_overflow");
  const std::string dir = temp.path().string();
  const std::string config = write_config(dir, small_root(dir + "/run"));
  // INT64_MAX printed negative byte counts; the data sources now bound their
  // token budget by what the plan and the drafter's arithmetic can hold.
  const Result huge = host_run("plan --config " + config + " --set data.tokens_per_batch=9223372036854775807 --gpu-memory 1GiB", dir);
  EXPECT_EQ(huge.status, 2) << huge.err;
  EXPECT_CONTAINS(huge.err, "data.tokens_per_batch: 9223372036854775807 is out of range, must be <= 4294967296");
  // The largest budget allowed is planned with sane figures and a budget that fits.
  const Result r = host_run("plan --config " + config + " --set data.tokens_per_batch=4294967296 --gpu-memory 1GiB", dir);
  EXPECT_EQ(r.status, 6) << r.err;
  EXPECT_CONTAINS(r.out, "verdict: does NOT fit");
  EXPECT_CONTAINS(r.out, "--set data.tokens_per_batch=");
  EXPECT_EQ(r.out.find("overflow"), std::string::npos) << r.out;
  EXPECT_FALSE(std::regex_search(r.out, std::regex(R"(\s-[0-9])"))) << "a negative figure:\n" << r.out;
}

// Integer settings beyond int64 and device names that are not devices are
// refused when the config is resolved, by every command (they ran "nothing to
// do" with exit 0, or died in LibTorch at train time).
TEST(PlanCommand, OutOfRangeIntegersAndBadDevicesAreRefusedAtConfigTime) {
  test::TempDir temp("dflash_plan_config");
  const std::string dir = temp.path().string();
  const std::string config = write_config(dir, small_root(dir + "/run"));
  for (const char* command : {"config", "plan", "train"}) {
    const Result steps = host_run(std::string(command) + " --config " + config + " --set train.steps=18446744073709551615", dir);
    EXPECT_EQ(steps.status, 2) << command << ": " << steps.err;
    EXPECT_CONTAINS(steps.err, "train.steps: 18446744073709551615 is out of range, must be <= 9223372036854775807 (a "
                               "64-bit integer); accepted: integer >= 1 and <= 1000000000 (dflash-host)");
    // Durations and rates past any real run: refused naming the key, where
    // 1e300 s overflowed to a timeout of −9.2e15 s, 1e-300 s became 0 s and
    // lr 1e300 failed at step 0 naming no setting.
    const std::pair<const char*, const char*> out_of_range[] = {
        {"train.collective_timeout_s=1e300", "train.collective_timeout_s: 1e+300 is out of range, must be <= 604800.0"},
        {"train.collective_timeout_s=1e-300", "train.collective_timeout_s: 1e-300 is out of range, must be >= 1.0"},
        {"train.lr=1e300", "train.lr: 1e+300 is out of range, must be <= 10.0"}};
    for (const auto& [setting, message] : out_of_range) {
      const Result refused = host_run(std::string(command) + " --config " + config + " --set " + setting, dir);
      EXPECT_EQ(refused.status, 2) << command << " " << setting << ": " << refused.err;
      EXPECT_CONTAINS(refused.err, message);
    }
    const Result device = host_run(std::string(command) + " --config " + config + " --set train.device=gpu", dir);
    EXPECT_EQ(device.status, 2) << command << ": " << device.err;
    EXPECT_CONTAINS(device.err, "train.device: \"gpu\" is not a device, did you mean \"cuda\"?; accepted: a device: "
                                "cpu, cuda or cuda:N (dflash-host)");
    EXPECT_EQ(device.err.find("c10"), std::string::npos) << device.err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/run")) << "nothing ran";
}

// A target whose config.json says hidden_size 10^12 made `plan` print "0 B"
// (its byte counts overflowed); the plugin now refuses sizes beyond what its
// arithmetic holds, naming the file and the key.
TEST(PlanCommand, ATargetTooLargeToPlanIsRefusedNamingItsConfig) {
  test::TempDir temp("dflash_plan_huge_target");
  const std::string dir = temp.path().string();
  const std::filesystem::path model = temp.path() / "huge";
  std::filesystem::create_directories(model);
  std::filesystem::copy_file(std::string(DFLASH_HF_FIXTURES) + "/qwen3/model.safetensors", model / "model.safetensors");
  nlohmann::json hf = nlohmann::json::parse(std::ifstream(std::string(DFLASH_HF_FIXTURES) + "/qwen3/config.json"));
  hf["hidden_size"] = int64_t{1000000000000};
  std::ofstream(model / "config.json") << hf.dump();
  nlohmann::json root = small_root(dir + "/run");
  root["target"]["path"] = model.string();
  const Result r = host_run("plan --config " + write_config(dir, root) + " --gpu-memory 1GiB", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_CONTAINS(r.err, (model / "config.json").string() + ": hidden_size: 1000000000000 is larger than 1048576, the "
                         "most this plugin supports");
  EXPECT_EQ(r.out.find("0 B"), std::string::npos) << r.out;
}

std::vector<nlohmann::json> metrics_of(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// An out-of-memory error at step 3 (the loss's 7th call, two micro-batches a
// step): a report, an emergency checkpoint of the 3 completed steps, exit 5;
// resuming from that checkpoint gives bitwise the run that never failed.
TEST(OutOfMemory, ReportsSavesTheLastCompletedStepAndResumesExactly) {
  test::TempDir temp("dflash_oom");
  const std::string dir = temp.path().string();
  nlohmann::json root = small_root(dir + "/whole");
  root["train"]["grad_accumulation"] = 2;
  root["loss"] = {{"plugin", "test_loss"}};
  const std::string whole = write_config(dir, root);
  ASSERT_EQ(host_run("--config " + whole, dir).status, 0);

  root["train"]["output_dir"] = dir + "/failing";
  root["loss"]["oom_at_call"] = 7;
  const Result oom = host_run("--config " + write_config(dir, root), dir);
  EXPECT_EQ(oom.status, 5) << oom.err;
  for (const char* part : {"=== out of memory on cpu at step 3, during the drafter forward + loss ===",
                           "tried to allocate 3.79 GiB (test_loss.oom_at_call)", "predicted", "actual", "drafter weights",
                           "AdamW states", "hidden-state items", "the rest at the peak",
                           "largest live tensors the host can name", "emergency checkpoint of the last completed step",
                           "step-00000003", "oom_report.txt", "dflash-host plan"})
    EXPECT_CONTAINS(oom.err, part);
  EXPECT_EQ(oom.err.find("Exception raised from"), std::string::npos) << "no stack trace";
  EXPECT_TRUE(std::filesystem::exists(dir + "/failing/oom_report.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/failing/checkpoints/step-00000003/model.safetensors"));
  const auto failed = metrics_of(dir + "/failing");
  ASSERT_EQ(failed.size(), 4u) << "3 steps and the out-of-memory record";
  EXPECT_TRUE(failed.back().contains("out_of_memory"));

  // Turning the fault injection off is a change of loss settings, which
  // resume refuses unless told.
  root["loss"]["oom_at_call"] = 0;
  const Result resumed = host_run("--config " + write_config(dir, root) + " --allow-config-change", dir);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_CONTAINS(resumed.err, "resumed from");
  // The resumed run rewrites the records from step 3 on (the failed one included).
  const auto a = metrics_of(dir + "/whole"), b = metrics_of(dir + "/failing");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(b[i].at("loss").get<double>(), a[i].at("loss").get<double>()) << "step " << i << " bitwise as uninterrupted";
  EXPECT_EQ(slurp(dir + "/whole/checkpoints/step-00000006/model.safetensors"),
            slurp(dir + "/failing/checkpoints/step-00000006/model.safetensors"));
}

}  // namespace
