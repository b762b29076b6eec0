// Times one drafter training step — forward, loss, backward, clipping, AdamW —
// at the Qwen3.6-27B drafter shape (5 layers, H 5120, 32/8 heads × 128, MLP
// 17408, V 248,320), with random inputs, through the plugin ABI exactly as
// the trainer runs it. Reports the step time, block tokens/s, the peak
// allocation, and the useful FLOP rate against a GEMM floor measured in the
// same run. A program, not a test: docs/performance.md has the figures.
//
//   drafter_bench --plugin-dir build-gpu/lib/dflash-host/plugins
//                 [--context 4096 --anchors 512 --block 16] [--precision same|fp32_master]
//                 [--loss fused_ckpt_kl] [--loss-set KEY=VALUE …] [--attention grouped|blocks|dense]
//                 [--group-blocks N] [--group-key-multiple N]   (default: the plugin's)
//                 [--attention-kernel auto|sdpa] [--layer-ops fused|aten]
//                 [--attention-keeps auto|rows|calls]
//                 [--checkpointing] [--embedding-on-cpu] [--adamw-kernel aten|ours]
//                 [--repeats 5 --warmup 2 --json out.jsonl] [--trace step.json]
//                 [--shard-optimizer] [--peer peer.jsonl]
//
// --peer names the peer's figures measured in the same call
// (scripts/peer_drafter_step.py --json); with it, and the peer's shape and
// bf16 states, the bench prints its ratios to them. No figure is kept here.
//
// Under torchrun (its RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
// each process is one rank of a data-parallel step, the drafter alone on GPU
// LOCAL_RANK with its own random inputs: the gradients averaged over the
// ranks in buckets during the backward (dist::GradientReducer, as the
// trainer does), over NCCL; --shard-optimizer splits the AdamW states
// (ZeRO-1, train::ShardedAdamW). Rank 0 prints the report, with the world's
// block tokens/s and every rank's step time and peaks (issue 19's scaling):
//   torchrun --no-python --nproc-per-node 2 build-gpu/bin/drafter_bench --plugin-dir …
//
// --loss-set KEY=VALUE (repeatable): one of the loss's settings (VALUE as
// JSON where it parses, else as text), e.g. --loss-set chunk_size=1024.
// --trace FILE: one more step under LibTorch's profiler, written as a Chrome
// trace (kineto_trace.h); scripts/trace_kernels.py sums its device time by
// kernel and by kind (GEMM, attention, element-wise, optimizer).
#include "bench_args.h"
#include "config/config_schema.h"
#include "dist/gradient_reducer.h"
#include "dist/process_group.h"
#include "memory/memory_stats.h"
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "train/adamw.h"
#include "train/sharded_adamw.h"

#include "bench_support.h"
#include "kineto_trace.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {
using namespace dflash;
using Clock = std::chrono::steady_clock;

// The peer's step at this shape, measured in the same call
// (scripts/peer_drafter_step.py --json, which scripts/device/peer_drafter.sh
// runs just before this bench): ratios are printed only against a figure of
// the same run, never against numbers kept in the program.
struct PeerFigures {
  double step_ms = 0, step_peak_gib = 0, total_peak_gib = 0;
  std::string who;
};
std::optional<PeerFigures> peer_from(const std::string& file, int64_t context, int64_t anchors, int64_t block) {
  if (file.empty()) return std::nullopt;
  std::ifstream in(file);
  if (!in) throw std::invalid_argument("--peer " + file + ": cannot be read");
  std::optional<PeerFigures> found;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("who") || j.value("context", int64_t{-1}) != context ||
        j.value("anchors", int64_t{-1}) != anchors || j.value("block", int64_t{-1}) != block)
      continue;
    found = PeerFigures{j.at("step_ms").get<double>(), j.at("step_peak_gib").get<double>(),
                        j.at("total_peak_gib").get<double>(), j.at("who").get<std::string>()};  // the last one
  }
  if (!found)
    throw std::invalid_argument("--peer " + file + ": no line of the peer at context " + std::to_string(context) +
                                ", " + std::to_string(anchors) + " anchors × block " + std::to_string(block));
  return found;
}

struct Args {
  std::string plugin_dir, loss = "fused_ckpt_kl", precision = "same", json, trace, attention, kernel = "auto";
  std::string peer;  // --peer FILE: the peer's figures from this call  // attention empty: the plugin's default
  std::string layer_ops = "fused", attention_keeps;  // empty: the plugin's default
  std::string adamw_kernel;                          // empty: AdamWOptions' default
  bool checkpointing = false, embedding_on_cpu = false, shard_optimizer = false;
  int64_t context = 4096, anchors = 512, block = 16, layers = 5, hidden = 5120, heads = 32, kv_heads = 8, head_dim = 128;
  int64_t intermediate = 17408, vocab = 248320, target_layers = 64;
  int64_t group_blocks = 0, group_key_multiple = 0;  // 0: the plugin's defaults
  nlohmann::json loss_settings = nlohmann::json::object();  // --loss-set KEY=VALUE
  int repeats = 5, warmup = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  dflash::bench::FlagReader r(argc, argv);
  while (r.next()) {
    if (r.is("--plugin-dir")) a.plugin_dir = r.text();
    else if (r.is("--loss")) a.loss = r.text();
    else if (r.is("--loss-set")) r.setting(a.loss_settings);
    else if (r.is("--precision")) a.precision = r.text();
    else if (r.is("--json")) a.json = r.text();
    else if (r.is("--peer")) a.peer = r.text();
    else if (r.is("--trace")) a.trace = r.text();
    else if (r.is("--attention")) a.attention = r.text();
    else if (r.is("--group-blocks")) a.group_blocks = r.integer();
    else if (r.is("--group-key-multiple")) a.group_key_multiple = r.integer();
    else if (r.is("--attention-kernel")) a.kernel = r.text();
    else if (r.is("--layer-ops")) a.layer_ops = r.text();
    else if (r.is("--attention-keeps")) a.attention_keeps = r.text();
    else if (r.is("--checkpointing")) a.checkpointing = true;
    else if (r.is("--embedding-on-cpu")) a.embedding_on_cpu = true;
    else if (r.is("--adamw-kernel")) a.adamw_kernel = r.text();
    else if (r.is("--shard-optimizer")) a.shard_optimizer = true;
    else if (r.is("--context")) a.context = r.integer();
    else if (r.is("--anchors")) a.anchors = r.integer();
    else if (r.is("--block")) a.block = r.integer();
    else if (r.is("--layers")) a.layers = r.integer();
    else if (r.is("--hidden")) a.hidden = r.integer();
    else if (r.is("--heads")) a.heads = r.integer();
    else if (r.is("--kv-heads")) a.kv_heads = r.integer();
    else if (r.is("--head-dim")) a.head_dim = r.integer();
    else if (r.is("--intermediate")) a.intermediate = r.integer();
    else if (r.is("--vocab")) a.vocab = r.integer();
    else if (r.is("--repeats")) a.repeats = static_cast<int>(r.integer());
    else if (r.is("--warmup")) a.warmup = static_cast<int>(r.integer());
    else r.unknown();
  }
  if (a.plugin_dir.empty()) throw std::invalid_argument("--plugin-dir DIR is required");
  if (a.precision != "same" && a.precision != "fp32_master") throw std::invalid_argument("--precision: same or fp32_master");
  if (!a.adamw_kernel.empty() && a.adamw_kernel != "aten" && a.adamw_kernel != "ours")
    throw std::invalid_argument("--adamw-kernel: aten or ours");
  return a;
}


}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "drafter_bench: " << e.what() << "\n";
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "drafter_bench: no CUDA device\n";
    return 2;
  }
  // One rank of a data-parallel step under torchrun; one process otherwise.
  std::optional<dist::LaunchEnvironment> launch;
  std::unique_ptr<dist::Collective> group;
  try {
    launch = dist::launch_environment();
    group = launch ? dist::join(*launch, "cuda:" + std::to_string(launch->local_rank), 600) : dist::single_process();
  } catch (const std::exception& e) {
    std::cerr << "drafter_bench: " << e.what() << "\n";
    return 2;
  }
  const int world = group->world_size(), rank = group->rank();
  if (world > 1 && !a.trace.empty()) {
    std::cerr << "drafter_bench: --trace is for one process (the ranks would step apart)\n";
    return 2;
  }
  const torch::Device device(torch::kCUDA, launch ? launch->local_rank : 0);
  const std::string device_name = device.str();
  const auto bf16 = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  host::PluginRegistry registry;
  registry.add_directory(a.plugin_dir);
  const nlohmann::json defaults = config::defaults_of(registry.find(DFLASH_KIND_DRAFTER, "dflash").schema);
  if (a.attention.empty()) a.attention = defaults.at("attention").get<std::string>();  // named in the report
  if (a.group_blocks == 0) a.group_blocks = defaults.at("attention_group_blocks").get<int64_t>();
  if (a.group_key_multiple == 0) a.group_key_multiple = defaults.at("attention_group_key_multiple").get<int64_t>();
  if (a.attention_keeps.empty()) a.attention_keeps = defaults.at("attention_keeps").get<std::string>();
  torch::manual_seed(0);

  // The frozen verifier weights, as the host places them on the drafter device.
  const double std_h = 1.0 / std::sqrt(static_cast<double>(a.hidden));
  host::NamedTensors frozen = {{"embed_tokens", torch::randn({a.vocab, a.hidden}, bf16)},
                               {"lm_head", torch::randn({a.vocab, a.hidden}, bf16) * std_h},
                               {"final_norm", torch::ones({a.hidden}, bf16)}};
  const nlohmann::json target = {{"num_layers", a.target_layers}, {"hidden_size", a.hidden}, {"vocab_size", a.vocab},
                                 {"num_attention_heads", a.heads}, {"num_key_value_heads", a.kv_heads},
                                 {"head_dim", a.head_dim}, {"intermediate_size", a.intermediate},
                                 {"rope_theta", 1e7}, {"rms_norm_eps", 1e-6}};
  const nlohmann::json drafter_config = {{"num_layers", a.layers}, {"num_attention_heads", 0}, {"num_key_value_heads", 0},
                                         {"head_dim", 0}, {"intermediate_size", 0}, {"block_size", a.block},
                                         {"max_anchors", a.anchors}, {"gamma", 0.0}, {"mask_token_id", -1},
                                         {"target_layer_ids", nlohmann::json::array()}, {"init_std", 0.02},
                                         {"rope_theta", 0.0}, {"attention", a.attention},
                                         {"attention_group_blocks", a.group_blocks}, {"attention_group_key_multiple", a.group_key_multiple}, {"attention_kernel", a.kernel},
                                         {"activation_checkpointing", a.checkpointing},
                                         {"embedding_on_cpu", a.embedding_on_cpu}, {"layer_ops", a.layer_ops},
                                         {"attention_keeps", a.attention_keeps}};
  host::DrafterInstance drafter(registry.find(DFLASH_KIND_DRAFTER, "dflash"), drafter_config, {device_name, "bfloat16", 1});
  drafter.bind_target(target, frozen);
  const at::Tensor lm_head = frozen[1].second;
  frozen.clear();  // as the trainer does: the drafter keeps what it needs
  const auto layer_ids = drafter.export_config()->at("target_layer_ids").get<std::vector<int64_t>>();
  // The loss's defaults, CE only (the peer trains on hard labels).
  const host::PluginRecord& loss_record = registry.find(DFLASH_KIND_LOSS, a.loss);
  nlohmann::json loss_config = config::defaults_of(loss_record.schema);
  if (loss_config.contains("kl_weight")) loss_config["kl_weight"] = 0.0;
  for (const auto& [key, value] : a.loss_settings.items()) {
    if (!loss_config.contains(key)) {
      std::cerr << "drafter_bench: --loss-set " << key << ": the loss '" << a.loss << "' has no such setting; its settings:";
      for (const auto& [known, unused] : loss_config.items()) std::cerr << " " << known;
      std::cerr << "\n";
      return 2;
    }
    loss_config[key] = value;
  }
  host::LossInstance loss(loss_record, loss_config, {device_name, "bfloat16", 1});
  const host::NamedTensors parameters = drafter.parameters();
  int64_t parameter_count = 0;
  for (const auto& [name, p] : parameters) parameter_count += p.numel();
  train::AdamWOptions options;
  options.fp32_master = a.precision == "fp32_master";
  if (!a.adamw_kernel.empty())
    options.kernel = a.adamw_kernel == "ours" ? train::AdamWOptions::Kernel::kOurs : train::AdamWOptions::Kernel::kAten;
  // Every rank built the same drafter (same seeds); each has its own states,
  // or its share of them with --shard-optimizer.
  std::unique_ptr<train::Optimizer> optimizer;
  if (a.shard_optimizer && world > 1) optimizer = std::make_unique<train::ShardedAdamW>(parameters, options, *group);
  else optimizer = std::make_unique<train::AdamW>(parameters, options);
  std::unique_ptr<dist::GradientReducer> reducer;
  if (world > 1) reducer = std::make_unique<dist::GradientReducer>(parameters, *group, options.fp32_master ? at::kFloat : at::kBFloat16);
  int64_t steps_taken = 0;
  if (world > 1) torch::manual_seed(1000 + rank);  // each rank its own inputs

  // One context row; every position supervised, so every anchor has a full block.
  host::NamedTensors inputs = {
      {"input_ids", torch::randint(0, a.vocab, {1, a.context}, torch::kLong)},
      {"loss_mask", torch::ones({1, a.context}, torch::kLong)},
      {"position_ids", torch::arange(a.context, torch::kLong).unsqueeze(0)},
      {"document_ids", torch::zeros({1, a.context}, torch::kLong)},
      {"sample_seed", torch::scalar_tensor(5, torch::kLong)}};
  for (int64_t id : layer_ids) inputs.emplace_back("hidden." + std::to_string(id), torch::randn({1, a.context, a.hidden}, bf16));

  int64_t rows = 0;
  // With `phases`, the step synchronises between its parts and records each
  // part's time (one extra step after the timed ones; it slows that step only).
  std::vector<std::pair<std::string, double>>* phases = nullptr;
  auto mark = [&](const char* name, Clock::time_point& since) {
    if (!phases) return;
    torch::cuda::synchronize();
    const auto now = Clock::now();
    phases->emplace_back(name, std::chrono::duration<double, std::milli>(now - since).count());
    since = now;
  };
  auto step = [&] {
    auto since = Clock::now();
    optimizer->zero_grad();
    const host::NamedTensors out = drafter.forward(inputs);
    mark("forward", since);
    host::LossCall call;
    for (const auto& [name, t] : out) {
      if (name == "hidden") call.hidden = t;
      if (name == "targets") call.targets = t;
      if (name == "row_weights") call.row_weights = t;
    }
    call.lm_head_weight = lm_head;
    rows = call.hidden.size(0);
    host::LossOutput result = loss.compute(call);
    mark("loss forward", since);
    if (reducer) reducer->arm(steps_taken);
    result.loss.backward();
    if (reducer) reducer->finish();  // the ranks' mean gradient in every .grad
    ++steps_taken;
    mark("backward", since);
    // Clipping at 1.0, as the peer clips and the trainer does: the norm here,
    // the factor inside the optimizer's update.
    const double norm = train::global_grad_norm(parameters);
    mark("clip", since);
    optimizer->step(1e-4, train::clip_factor(norm, 1.0));
    mark("adamw", since);
  };
  // Warm-up; then the timed steps' peak, as the peer measures it: the
  // allocator's peak minus what was allocated before a step (weights,
  // optimizer states, frozen tensors, inputs; gradients are freed by
  // zero_grad at each step's start, so they count in the step).
  for (int i = 0; i < a.warmup; ++i) step();
  optimizer->zero_grad();
  torch::cuda::synchronize();
  const int64_t before_step = memory::memory_now(device).current_bytes;
  memory::reset_peak(device);
  const double step_ms = bench::median_ms(0, a.repeats, step);
  const memory::MemoryFigures mem = memory::memory_now(device);
  std::vector<std::pair<std::string, double>> phase_ms;
  phases = &phase_ms;
  step();
  phases = nullptr;
  if (!a.trace.empty()) {
    std::string why;
    if (!bench::trace_to(a.trace, [&] {
          step();
          torch::cuda::synchronize();
        }, why))
      std::cerr << "drafter_bench: no trace written to " << a.trace << ": " << why << "\n";
  }

  // Useful FLOP per step: the layers (fwd + bwd: 6 per parameter per block
  // token), the frozen lm_head (logits + dX: 4·H·V per supervised row), fc and
  // the context K/V projections over the context, and attention (each block
  // query sees on average half the context plus its block; fwd + bwd ≈ 3.5 × 4·d per key).
  const int64_t block_tokens = a.anchors * a.block;
  const double layer_params = static_cast<double>(a.hidden) * (a.heads * a.head_dim) * 2 +
                              2.0 * a.hidden * (a.kv_heads * a.head_dim) + 3.0 * a.hidden * a.intermediate;
  const double flop_layers = 6.0 * layer_params * a.layers * static_cast<double>(block_tokens);
  const double flop_head = 4.0 * a.hidden * static_cast<double>(a.vocab) * static_cast<double>(rows);
  const double flop_context = 6.0 * a.context * (static_cast<double>(layer_ids.size()) * a.hidden * a.hidden +
                                                 a.layers * 2.0 * a.hidden * a.kv_heads * a.head_dim);
  const double flop_attention = 3.5 * 4.0 * a.head_dim * a.heads * a.layers * static_cast<double>(block_tokens) *
                                (a.context / 2.0 + a.block);
  const double flop = flop_layers + flop_head + flop_context + flop_attention;

  // The floor: the step's GEMMs alone at its shapes (bf16, cuBLAS), same run.
  torch::NoGradGuard no_grad;
  auto x = torch::randn({block_tokens, a.hidden}, bf16), w_q = torch::randn({a.heads * a.head_dim, a.hidden}, bf16);
  auto w_mlp = torch::randn({a.intermediate, a.hidden}, bf16), head_x = torch::randn({rows, a.hidden}, bf16);
  const double gemm_ms = bench::median_ms(a.warmup, a.repeats, [&] {
    for (int i = 0; i < 3; ++i) auto y = torch::mm(x, w_mlp.t());
    auto z = torch::mm(head_x.narrow(0, 0, std::min<int64_t>(rows, 4096)), lm_head.t());
  });
  const double gemm_flop = 3 * 2.0 * block_tokens * a.hidden * a.intermediate +
                           2.0 * std::min<int64_t>(rows, 4096) * a.hidden * static_cast<double>(a.vocab);
  const double gemm_tflops = gemm_flop / (gemm_ms * 1e9);
  const double tflops = flop / (step_ms * 1e9);

  // The peer at this shape, when it is one of the three it published, like
  // with like: step peak against its step peak, total against its total.
  const double step_peak_gib = (mem.peak_bytes - before_step) / double(1 << 30), total_peak_gib = mem.peak_bytes / double(1 << 30);
  // Every rank's step and peaks, in rank order; rank 0 reports them.
  std::vector<nlohmann::json> ranks;
  for (const std::string& text :
       group->all_gather_text(nlohmann::json{{"rank", rank}, {"step_ms", step_ms}, {"step_peak_gib", step_peak_gib},
                                             {"total_peak_gib", total_peak_gib}}
                                  .dump(),
                              "the ranks' step figures"))
    ranks.push_back(nlohmann::json::parse(text));
  if (rank != 0) return 0;
  double slowest_ms = 0;
  for (const nlohmann::json& r : ranks) slowest_ms = std::max(slowest_ms, r.at("step_ms").get<double>());
  const double world_tokens_per_s = world * block_tokens / (slowest_ms / 1000);
  // The peer's figures are one GPU's.
  const std::optional<PeerFigures> peer = world == 1 ? peer_from(a.peer, a.context, a.anchors, a.block) : std::nullopt;
  // Like with like: the peer's shape and state precision (bf16 weights,
  // gradients, AdamW states). Where the frozen embedding lives is ours to
  // choose: with embedding_on_cpu it is simply not on the device, and the
  // total says so.
  const bool like_with_like = peer.has_value() && a.precision == "same";

  std::cout << std::fixed << std::setprecision(1);
  std::cout << "drafter_bench: " << a.layers << " layers, H " << a.hidden << ", " << a.heads << "/" << a.kv_heads << " heads x "
            << a.head_dim << ", MLP " << a.intermediate << ", V " << a.vocab << "; " << parameter_count / 1e9
            << " B trainable parameters; context " << a.context << ", " << a.anchors << " anchors x block " << a.block
            << " = " << block_tokens << " block tokens (" << rows << " loss rows); loss " << a.loss
            << (a.loss_settings.empty() ? std::string() : " " + a.loss_settings.dump()) << ", precision "
            << a.precision << ", attention " << a.attention
            << (a.attention != "dense" ? " (" + std::to_string(a.group_blocks) + " blocks, keys by " +
                                             std::to_string(a.group_key_multiple) + ")"
                                       : std::string())
            << ", kernel "
            << a.kernel << ", layer ops " << a.layer_ops << ", attention keeps " << a.attention_keeps
            << (a.checkpointing ? ", activation checkpointing" : "")
            << (a.embedding_on_cpu ? ", embedding in host memory" : "") << ", AdamW kernel " << optimizer->last_kernel()
            << "; median of " << a.repeats << " after " << a.warmup << "\n";
  std::cout << "step " << step_ms << " ms, " << std::setprecision(0) << block_tokens / (step_ms / 1000)
            << " block tokens/s; step peak " << std::setprecision(2) << step_peak_gib << " GiB (above the "
            << before_step / double(1 << 30) << " GiB allocated before the step); total peak " << total_peak_gib << " GiB\n";
  if (like_with_like)
    std::cout << "vs the peer in this call (" << peer->who << ", " << a.peer << "): speed " << peer->step_ms / step_ms << " x, step peak "
              << step_peak_gib / peer->step_peak_gib << " x its " << peer->step_peak_gib << " GiB, total peak "
              << total_peak_gib / peer->total_peak_gib << " x its " << peer->total_peak_gib << " GiB"
              << (a.embedding_on_cpu ? " (our frozen embedding in host memory, the peer's on its device)" : "") << "\n";
  else if (peer)
    std::cout << "the peer ran this shape with bf16 states; this run's differ, so no ratio is printed\n";
  if (world > 1) {
    std::cout << std::setprecision(1) << "data-parallel over " << world << " GPUs (NCCL"
              << (a.shard_optimizer ? ", AdamW states sharded" : "") << "): slowest rank's step " << slowest_ms
              << " ms, " << std::setprecision(0) << world_tokens_per_s << " block tokens/s in all; per rank:";
    for (const nlohmann::json& r : ranks)
      std::cout << std::setprecision(1) << " " << r.at("rank").get<int>() << ": " << r.at("step_ms").get<double>() << " ms, "
                << std::setprecision(2) << r.at("step_peak_gib").get<double>() << " / " << r.at("total_peak_gib").get<double>()
                << " GiB;";
    std::cout << "\n";
  }
  std::cout << std::setprecision(1) << "useful FLOP " << flop / 1e12 << " T per step (layers " << flop_layers / 1e12 << ", lm_head "
            << flop_head / 1e12 << ", context " << flop_context / 1e12 << ", attention " << flop_attention / 1e12 << ") = "
            << std::setprecision(0) << tflops << " TFLOP/s; same-run GEMM floor " << gemm_tflops << " TFLOP/s ("
            << std::setprecision(2) << tflops / gemm_tflops << " of it)\n";
  std::cout << std::setprecision(1) << "phases (one synchronised step):";
  for (const auto& [name, ms] : phase_ms) std::cout << " " << name << " " << ms << " ms;";
  std::cout << "\n";
  if (!a.json.empty())
    std::ofstream(a.json, std::ios::app) << nlohmann::json{{"step_ms", step_ms}, {"block_tokens_per_s", block_tokens / (step_ms / 1000)},
                                                           {"step_peak_gib", step_peak_gib},
                                                           {"total_peak_gib", total_peak_gib}, {"tflops", tflops},
                                                           {"vs_peer", like_with_like ? nlohmann::json{{"speed", peer->step_ms / step_ms},
                                                                                                        {"step_peak", step_peak_gib / peer->step_peak_gib},
                                                                                                        {"total_peak", total_peak_gib / peer->total_peak_gib}}
                                                                                      : nlohmann::json(nullptr)},
                                                           {"gemm_floor_tflops", gemm_tflops}, {"precision", a.precision},
                                                           {"context", a.context}, {"anchors", a.anchors}, {"block", a.block},
                                                           {"attention", a.attention}, {"group_blocks", a.group_blocks}, {"group_key_multiple", a.group_key_multiple}, {"attention_kernel", a.kernel},
                                                           {"layer_ops", a.layer_ops}, {"attention_keeps", a.attention_keeps},
                                                           {"checkpointing", a.checkpointing}, {"loss_settings", a.loss_settings},
                                                           {"adamw_kernel", optimizer->last_kernel()},
                                                           {"embedding_on_cpu", a.embedding_on_cpu},
                                                           {"parameters", parameter_count}, {"world_size", world},
                                                           {"shard_optimizer", a.shard_optimizer && world > 1},
                                                           {"world_block_tokens_per_s", world_tokens_per_s},
                                                           {"ranks", ranks}}
                                                .dump()
                                         << "\n";
  return 0;
}
