// Times one EAGLE-3 training step — the training-time test unrolled over
// ttt_steps, the loss over the draft vocabulary against the target's
// distribution, backward, clipping, AdamW — at a Llama-3.1-8B- or
// Qwen3-8B-shaped drafter, with random inputs, through the plugin ABI as the
// trainer runs it (train/stages.cpp). Reports the step time, tokens/s, the
// step peak and total peak, and the useful FLOP rate against a GEMM floor
// measured in the same run. A program, not a test: docs/eagle3.md has the
// figures (issue 43).
//
//   eagle3_bench --plugin-dir build-gpu/lib/dflash-host/plugins
//                [--shape llama3-8b|qwen3-8b] [--context 2048] [--ttt 7] [--draft-vocab 32000]
//                [--loss kl] [--loss-set KEY=VALUE …] [--precision fp32_master|same] [--clip 0.5]
//                [--layer-ops fused|aten] [--attention-kernel auto|chunked]   (default: the plugin's)
//                [--repeats 5 --warmup 2] [--json out.jsonl] [--peer peer.jsonl] [--trace step.json]
//
// The defaults are the peer's (SpecForge's EAGLE-3 trainer,
// scripts/peer_eagle3_step.py): 7 TTT steps, a 32,000-token draft vocabulary,
// the target's distribution as the teacher (KL), AdamW over fp32 master
// weights, clipping at 0.5. The input tokens are drawn from the draft
// vocabulary, so every position is a supervised row at every step (our
// drafter scores only rows whose next token has a draft id; the peer scores
// every row whatever the mask): the most work ours can have.
//
// --peer names the peer's figures measured in the same call
// (scripts/peer_eagle3_step.py --json); the bench prints its ratios to each
// of the peer's lines at this shape, context and TTT length. No figure is
// kept here.
#include "bench_args.h"
#include "config/config_schema.h"
#include "memory/memory_stats.h"
#include "plugin/drafter_facts.h"
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "train/adamw.h"

#include "bench_support.h"
#include "kineto_trace.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

namespace {
using namespace dflash;
using Clock = std::chrono::steady_clock;

// The target's facts at the two published EAGLE-3 shapes (SpecForge's
// configs/llama3-8B-eagle3.json and configs/qwen3-8b-eagle3.json and the
// targets they serve).
struct Shape {
  int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab;
  double rope_theta, rms_norm_eps;
};
Shape shape_named(const std::string& name) {
  if (name == "llama3-8b") return {32, 4096, 32, 8, 128, 14336, 128256, 500000.0, 1e-5};
  if (name == "qwen3-8b") return {36, 4096, 32, 8, 128, 12288, 151936, 1000000.0, 1e-6};
  throw std::invalid_argument("--shape: llama3-8b or qwen3-8b, not '" + name + "'");
}

struct Args {
  std::string plugin_dir, shape = "llama3-8b", loss = "kl", precision = "fp32_master", json, peer, trace, layer_ops, attention_kernel;
  nlohmann::json loss_settings = nlohmann::json::object();
  int64_t context = 2048, ttt = 7, draft_vocab = 32000;
  double clip = 0.5;
  int repeats = 5, warmup = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  bench::FlagReader r(argc, argv);
  while (r.next()) {
    if (r.is("--plugin-dir")) a.plugin_dir = r.text();
    else if (r.is("--shape")) a.shape = r.text();
    else if (r.is("--context")) a.context = r.integer();
    else if (r.is("--ttt")) a.ttt = r.integer();
    else if (r.is("--draft-vocab")) a.draft_vocab = r.integer();
    else if (r.is("--loss")) a.loss = r.text();
    else if (r.is("--loss-set")) r.setting(a.loss_settings);
    else if (r.is("--precision")) a.precision = r.text();
    else if (r.is("--clip")) a.clip = std::stod(r.text());
    else if (r.is("--layer-ops")) a.layer_ops = r.text();
    else if (r.is("--attention-kernel")) a.attention_kernel = r.text();
    else if (r.is("--repeats")) a.repeats = static_cast<int>(r.integer());
    else if (r.is("--warmup")) a.warmup = static_cast<int>(r.integer());
    else if (r.is("--json")) a.json = r.text();
    else if (r.is("--peer")) a.peer = r.text();
    else if (r.is("--trace")) a.trace = r.text();
    else r.unknown();
  }
  if (a.plugin_dir.empty()) throw std::invalid_argument("--plugin-dir DIR is required");
  if (a.precision != "same" && a.precision != "fp32_master") throw std::invalid_argument("--precision: same or fp32_master");
  shape_named(a.shape);
  return a;
}

// The peer's lines of this call at this shape, context and TTT length.
std::vector<nlohmann::json> peer_lines(const Args& a) {
  std::vector<nlohmann::json> lines;
  if (a.peer.empty()) return lines;
  std::ifstream in(a.peer);
  if (!in) throw std::invalid_argument("--peer " + a.peer + ": cannot be read");
  for (std::string line; std::getline(in, line);) {
    if (!nlohmann::json::accept(line)) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("shape", "") == a.shape && j.value("context", int64_t{-1}) == a.context && j.value("ttt", int64_t{-1}) == a.ttt)
      lines.push_back(j);
  }
  return lines;
}

// Token counts that make the draft vocabulary the first draft_vocab ids.
std::string write_counts(int64_t vocab, int64_t draft_vocab) {
  const std::string path = (std::filesystem::temp_directory_path() / ("eagle3_bench_counts_" + std::to_string(vocab) + "_" +
                                                                       std::to_string(draft_vocab) + ".json"))
                               .string();
  std::vector<int64_t> counts(vocab, 0);
  for (int64_t i = 0; i < draft_vocab; ++i) counts[i] = 1;
  std::ofstream(path) << nlohmann::json{{"counts", counts}}.dump();
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "eagle3_bench: " << e.what() << "\n";
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "eagle3_bench: no CUDA device\n";
    return 2;
  }
  const Shape s = shape_named(a.shape);
  const torch::Device device(torch::kCUDA, 0);
  const std::string device_name = device.str();
  const auto bf16 = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  host::PluginRegistry registry;
  registry.add_directory(a.plugin_dir);
  torch::manual_seed(0);

  // The drafter, bound to a target of this shape as the trainer binds it.
  const host::PluginRecord& drafter_record = registry.find(DFLASH_KIND_DRAFTER, "eagle3");
  nlohmann::json drafter_config = config::defaults_of(drafter_record.schema);
  const std::string counts = write_counts(s.vocab, a.draft_vocab);
  drafter_config["token_counts"] = counts;
  drafter_config["draft_vocab_size"] = a.draft_vocab;
  drafter_config["ttt_steps"] = a.ttt;
  if (a.layer_ops.empty()) a.layer_ops = drafter_config.at("layer_ops").get<std::string>();  // named in the report
  drafter_config["layer_ops"] = a.layer_ops;
  if (a.attention_kernel.empty()) a.attention_kernel = drafter_config.at("attention_kernel").get<std::string>();
  drafter_config["attention_kernel"] = a.attention_kernel;
  host::DrafterInstance drafter(drafter_record, drafter_config, {device_name, "bfloat16", 1});
  const double std_h = 1.0 / std::sqrt(static_cast<double>(s.hidden));
  const nlohmann::json target = {{"num_layers", s.layers}, {"hidden_size", s.hidden}, {"vocab_size", s.vocab},
                                 {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
                                 {"head_dim", s.head_dim}, {"intermediate_size", s.intermediate},
                                 {"rope_theta", s.rope_theta}, {"rms_norm_eps", s.rms_norm_eps},
                                 {"max_position_embeddings", std::max<int64_t>(8192, a.context + a.ttt)}};
  {
    const host::NamedTensors frozen = {{"embed_tokens", torch::randn({s.vocab, s.hidden}, bf16)},
                                       {"lm_head", torch::randn({s.vocab, s.hidden}, bf16) * std_h},
                                       {"final_norm", torch::ones({s.hidden}, bf16)}};
    drafter.bind_target(target, frozen);
  }  // as the trainer does: the drafter keeps what it needs (the embedding, the teacher's rows)
  std::remove(counts.c_str());
  const std::optional<host::DrafterInstance::LossHeads> heads = drafter.loss_heads();
  if (!heads || !heads->teacher_lm_head.defined()) {
    std::cerr << "eagle3_bench: the eagle3 drafter gave no loss heads\n";
    return 1;
  }
  const std::vector<int64_t> layer_ids = host::drafter_facts(drafter).target_layer_ids;

  const host::PluginRecord& loss_record = registry.find(DFLASH_KIND_LOSS, a.loss);
  nlohmann::json loss_config = config::defaults_of(loss_record.schema);
  for (const auto& [key, value] : a.loss_settings.items()) {
    if (!loss_config.contains(key)) {
      std::cerr << "eagle3_bench: --loss-set " << key << ": the loss '" << a.loss << "' has no such setting\n";
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
  train::AdamW optimizer(parameters, options);

  // One row of context tokens from the draft vocabulary; every position supervised.
  host::NamedTensors inputs = {{"input_ids", torch::randint(0, a.draft_vocab, {1, a.context}, torch::kLong)},
                               {"loss_mask", torch::ones({1, a.context}, torch::kLong)},
                               {"position_ids", torch::arange(a.context, torch::kLong).unsqueeze(0)},
                               {"document_ids", torch::zeros({1, a.context}, torch::kLong)},
                               {"sample_seed", torch::scalar_tensor(5, torch::kLong)},
                               {"last_hidden", torch::randn({1, a.context, s.hidden}, bf16)}};
  for (int64_t id : layer_ids) inputs.emplace_back("hidden." + std::to_string(id), torch::randn({1, a.context, s.hidden}, bf16));

  int64_t rows = 0;
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
    optimizer.zero_grad();
    const host::NamedTensors out = drafter.forward(inputs);
    mark("forward", since);
    host::LossCall call;
    call.hidden = host::require_tensor(out, "hidden", "eagle3");
    call.targets = host::require_tensor(out, "targets", "eagle3");
    call.row_weights = host::find_tensor(out, "row_weights");
    call.lm_head_weight = heads->lm_head;
    call.teacher = DFLASH_TEACHER_HIDDEN;
    call.teacher_hidden = host::require_tensor(out, "teacher_hidden", "eagle3");
    call.teacher_lm_head_weight = heads->teacher_lm_head;
    rows = call.hidden.size(0);
    host::LossOutput result = loss.compute(call);
    mark("loss forward", since);
    result.loss.backward();
    mark("backward", since);
    const double norm = train::global_grad_norm(parameters);
    mark("clip", since);
    optimizer.step(1e-4, train::clip_factor(norm, a.clip));
    mark("adamw", since);
  };
  for (int i = 0; i < a.warmup; ++i) step();
  optimizer.zero_grad();
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
      std::cerr << "eagle3_bench: no trace written to " << a.trace << ": " << why << "\n";
  }

  // Useful FLOP per step. The layer (fwd + bwd: 6 per parameter per row and
  // TTT step; q/k/v read 2H), fc over the context once (fwd + dW: 4 per
  // parameter per token), the draft head (6·H·V_d per row: logits, dX, dW),
  // the teacher's head (2·H·V_d per row, no gradient) and attention (a step-k
  // query sees half the context on average plus k own keys; fwd + bwd ≈ 3.5 × 4·d per key).
  const double q_width = static_cast<double>(s.heads * s.head_dim), kv_width = static_cast<double>(s.kv_heads * s.head_dim);
  const double layer_params = 2.0 * s.hidden * (q_width + 2 * kv_width) + q_width * s.hidden + 3.0 * s.hidden * s.intermediate;
  const double tokens = static_cast<double>(a.context) * a.ttt;
  const double flop_layer = 6.0 * layer_params * tokens;
  const double flop_fc = 4.0 * 3.0 * s.hidden * s.hidden * a.context;
  const double flop_heads = 8.0 * s.hidden * static_cast<double>(a.draft_vocab) * static_cast<double>(rows);
  const double flop_attention = 3.5 * 4.0 * q_width * tokens * (a.context / 2.0 + a.ttt / 2.0);
  const double flop = flop_layer + flop_fc + flop_heads + flop_attention;

  // The floor: the step's largest GEMMs alone at its shapes (bf16, cuBLAS), same run.
  torch::NoGradGuard no_grad;
  auto x = torch::randn({a.context, s.hidden}, bf16), w_mlp = torch::randn({s.intermediate, s.hidden}, bf16);
  auto w_head = torch::randn({a.draft_vocab, s.hidden}, bf16);
  const double gemm_ms = bench::median_ms(a.warmup, a.repeats, [&] {
    for (int i = 0; i < 3; ++i) auto y = torch::mm(x, w_mlp.t());
    auto z = torch::mm(x, w_head.t());
  });
  const double gemm_flop = 3 * 2.0 * a.context * s.hidden * s.intermediate + 2.0 * a.context * s.hidden * a.draft_vocab;
  const double gemm_tflops = gemm_flop / (gemm_ms * 1e9);
  const double tflops = flop / (step_ms * 1e9);

  const double step_peak_gib = (mem.peak_bytes - before_step) / double(1 << 30), total_peak_gib = mem.peak_bytes / double(1 << 30);
  std::vector<nlohmann::json> peers;
  try {
    peers = peer_lines(a);
  } catch (const std::exception& e) {
    std::cerr << "eagle3_bench: " << e.what() << "\n";
    return 2;
  }
  std::cout << std::fixed << std::setprecision(3);
  std::cout << "eagle3_bench: " << a.shape << " (H " << s.hidden << ", " << s.heads << "/" << s.kv_heads << " heads x " << s.head_dim
            << ", MLP " << s.intermediate << ", V " << s.vocab << ", draft vocabulary " << a.draft_vocab << "); "
            << parameter_count / 1e9 << " B trainable parameters; context " << a.context << ", " << a.ttt
            << " TTT steps (" << rows << " loss rows); loss " << a.loss
            << (a.loss_settings.empty() ? std::string() : " " + a.loss_settings.dump()) << ", precision " << a.precision
            << ", clip " << a.clip << ", layer ops " << a.layer_ops << ", attention kernel " << a.attention_kernel << ", AdamW kernel " << optimizer.last_kernel() << "; median of " << a.repeats
            << " after " << a.warmup << "\n";
  std::cout << std::setprecision(1) << "step " << step_ms << " ms, " << std::setprecision(0) << a.context / (step_ms / 1000)
            << " tokens/s; step peak " << std::setprecision(2) << step_peak_gib << " GiB (above the "
            << before_step / double(1 << 30) << " GiB allocated before the step); total peak " << total_peak_gib << " GiB\n";
  nlohmann::json vs = nlohmann::json::array();
  const bool like_with_like = a.precision == "fp32_master" && a.clip == 0.5;
  for (const nlohmann::json& p : peers) {
    if (!like_with_like) {
      std::cout << "the peer ran with fp32 master weights and clipping at 0.5; this run differs, so no ratio is printed\n";
      break;
    }
    const double speed = p.at("step_ms").get<double>() / step_ms, step_peak = step_peak_gib / p.at("step_peak_gib").get<double>(),
                 total_peak = total_peak_gib / p.at("total_peak_gib").get<double>();
    std::cout << "vs the peer in this call (" << p.value("who", "?") << "): speed " << speed << " x, step peak " << step_peak
              << " x its " << p.at("step_peak_gib").get<double>() << " GiB, total peak " << total_peak << " x its "
              << p.at("total_peak_gib").get<double>() << " GiB\n";
    vs.push_back({{"peer", p.value("who", "?")}, {"speed", speed}, {"step_peak", step_peak}, {"total_peak", total_peak}});
  }
  std::cout << std::setprecision(1) << "useful FLOP " << flop / 1e12 << " T per step (layer " << flop_layer / 1e12 << ", fc "
            << flop_fc / 1e12 << ", heads " << flop_heads / 1e12 << ", attention " << flop_attention / 1e12 << ") = "
            << std::setprecision(0) << tflops << " TFLOP/s; same-run GEMM floor " << gemm_tflops << " TFLOP/s ("
            << std::setprecision(2) << tflops / gemm_tflops << " of it)\n";
  std::cout << std::setprecision(1) << "phases (one synchronised step):";
  for (const auto& [name, ms] : phase_ms) std::cout << " " << name << " " << ms << " ms;";
  std::cout << "\n";
  if (!a.json.empty())
    std::ofstream(a.json, std::ios::app) << nlohmann::json{{"shape", a.shape}, {"context", a.context}, {"ttt", a.ttt},
                                                           {"draft_vocab", a.draft_vocab}, {"loss", a.loss},
                                                           {"loss_settings", a.loss_settings}, {"precision", a.precision},
                                                           {"layer_ops", a.layer_ops}, {"attention_kernel", a.attention_kernel},
                                                           {"step_ms", step_ms}, {"step_peak_gib", step_peak_gib},
                                                           {"total_peak_gib", total_peak_gib}, {"rows", rows},
                                                           {"tflops", tflops}, {"gemm_floor_tflops", gemm_tflops},
                                                           {"parameters", parameter_count}, {"vs_peer", vs},
                                                           {"phases_ms", phase_ms}}
                                                .dump()
                                         << "\n";
  return 0;
}
