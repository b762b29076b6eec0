// Times every loss plugin, forward + backward, at the DFlash drafter shape on
// one GPU, beside a plain GEMM [N,H]×[H,V] measured in the same run (the
// floor), and reports time, ratio to the floor, useful TFLOP/s and extra peak
// memory. A program, not a test: see docs/performance.md for the figures.
//
//   loss_bench --plugin-dir build-gpu/lib/dflash-host/plugins [--plugin-dir more …] [--rows 32768 --hidden 5120 --vocab 248320]
//              [--repeats 5 --warmup 2 --topk 64 --json out.jsonl] [--chunk-size 0]
//
// --chunk-size: fused_ckpt_kl's rows per chunk (its chunk_size; 0 = as many
// as its default workspace budget allows, at most 2048); the diagnostic rows
// time the bare GEMMs at 512, 1024 and 2048 rows per chunk for comparison.
#include "bench_args.h"
#include "plugin/instances.h"
#include "plugin/registry.h"

#include "bench_support.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

namespace {
using namespace dflash::host;
using dflash::bench::Measurement;
using dflash::bench::measure;

struct Args {
  std::vector<std::string> plugin_dirs;  // --plugin-dir DIR (repeatable)
  int64_t rows = 32768, hidden = 5120, vocab = 248320, topk = 64;
  int repeats = 5, warmup = 2;
  int64_t chunk_size = 0;
  std::string json;
  std::vector<std::string> only;  // --only NAME (repeatable): arms to run
};

Args parse(int argc, char** argv) {
  Args a;
  dflash::bench::FlagReader r(argc, argv);
  while (r.next()) {
    if (r.is("--plugin-dir")) a.plugin_dirs.push_back(r.text());
    else if (r.is("--rows")) a.rows = r.integer();
    else if (r.is("--hidden")) a.hidden = r.integer();
    else if (r.is("--vocab")) a.vocab = r.integer();
    else if (r.is("--topk")) a.topk = r.integer();
    else if (r.is("--chunk-size")) a.chunk_size = r.integer();
    else if (r.is("--repeats")) a.repeats = static_cast<int>(r.integer());
    else if (r.is("--warmup")) a.warmup = static_cast<int>(r.integer());
    else if (r.is("--json")) a.json = r.text();
    else if (r.is("--only")) a.only.push_back(r.text());
    else r.unknown();
  }
  if (a.plugin_dirs.empty()) throw std::invalid_argument("--plugin-dir DIR is required");
  return a;
}


struct Arm {
  std::string label;
  std::string plugin;
  nlohmann::json config;
  dflash_teacher_kind teacher;
  int gemms;  // useful GEMMs of the math: 2 for CE (logits, dX), 3 with the teacher
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "loss_bench: " << e.what() << "\n";
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "loss_bench: no CUDA device\n";
    return 2;
  }
  PluginRegistry registry;
  for (const std::string& dir : args.plugin_dirs) registry.add_directory(dir);

  const auto device = torch::Device(torch::kCUDA, 0);
  const auto bf16 = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  torch::manual_seed(0);
  const int64_t n = args.rows, h = args.hidden, v = args.vocab;
  auto weight = (torch::randn({v, h}, bf16) * (1.0 / std::sqrt(static_cast<double>(h)))).contiguous();
  auto hidden = torch::randn({n, h}, bf16).requires_grad_(true);
  auto teacher_hidden = (hidden.detach() + 0.5 * torch::randn({n, h}, bf16)).contiguous();
  auto targets = torch::randint(0, v, {n}, torch::TensorOptions().device(device).dtype(torch::kLong));
  targets.masked_fill_(torch::rand({n}, torch::TensorOptions().device(device)).lt(0.1), -100);
  auto row_weights = torch::rand({n}, torch::TensorOptions().device(device));
  torch::Tensor topk_ids, topk_logprobs;
  {
    // The teacher's top-K, made chunk by chunk (the full [N, V] would not fit beside everything else).
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> ids, lps;
    for (int64_t s = 0; s < n; s += 2048) {
      auto logp = torch::log_softmax(torch::matmul(teacher_hidden.narrow(0, s, std::min<int64_t>(2048, n - s)), weight.t()).to(torch::kFloat), 1);
      auto top = logp.topk(args.topk, 1);
      lps.push_back(std::get<0>(top));
      ids.push_back(std::get<1>(top));
    }
    topk_ids = torch::cat(ids);
    topk_logprobs = torch::cat(lps);
  }

  const double gemm_flop = 2.0 * static_cast<double>(n) * static_cast<double>(h) * static_cast<double>(v);
  // The floor: one plain GEMM, same shapes, same run.
  const Measurement gemm = measure(args.warmup, args.repeats, [&] {
    torch::NoGradGuard no_grad;
    auto logits = torch::matmul(hidden, weight.t());
  });

  const std::vector<Arm> arms = {
      {"ce", "ce", {{"reduction", "mean"}}, DFLASH_TEACHER_NONE, 2},
      {"kl (blend 0.5)", "kl", {{"kl_weight", 0.5}, {"temperature", 1.0}, {"reduction", "mean"}}, DFLASH_TEACHER_HIDDEN, 3},
      {"topk_kl (K=" + std::to_string(args.topk) + ", blend 0.5)", "topk_kl",
       {{"kl_weight", 0.5}, {"temperature", 1.0}, {"reduction", "mean"}, {"topk", 0}}, DFLASH_TEACHER_TOPK, 2},
      {"fused_ckpt_kl CE only", "fused_ckpt_kl",
       {{"kl_weight", 0.0}, {"temperature", 1.0}, {"reduction", "mean"}, {"chunk_size", args.chunk_size}},
       DFLASH_TEACHER_NONE, 2},
      {"fused_ckpt_kl CE+KL (blend 0.5)", "fused_ckpt_kl",
       {{"kl_weight", 0.5}, {"temperature", 1.0}, {"reduction", "mean"}, {"chunk_size", args.chunk_size}},
       DFLASH_TEACHER_HIDDEN, 3},
      // CE only in Liger's chunks (1024 rows at this shape) beside the automatic ones.
      {"fused_ckpt_kl CE only, 1024-row chunks", "fused_ckpt_kl",
       {{"kl_weight", 0.0}, {"temperature", 1.0}, {"reduction", "mean"}, {"chunk_size", 1024}},
       DFLASH_TEACHER_NONE, 2},
      // The SDK's example losses (sdk/examples; --plugin-dir build-gpu/test-plugins/sdk-examples), defaults only.
      {"example_weighted_ce (toolkit, autograd)", "example_weighted_ce", {{"temperature", 1.0}}, DFLASH_TEACHER_NONE, 2},
      {"example_reverse_kl (toolkit, closed form)", "example_reverse_kl", {{"temperature", 1.0}}, DFLASH_TEACHER_HIDDEN, 3},
      {"example_jsd (toolkit, autograd)", "example_jsd", {{"beta", 0.5}, {"temperature", 1.0}}, DFLASH_TEACHER_HIDDEN, 3},
  };

  std::ofstream json;
  if (!args.json.empty()) json.open(args.json);
  auto record = [&](const std::string& label, const Measurement& m, int gemms) {
    const double floor_ms = gemm.median_ms * gemms;
    std::cout << std::left << std::setw(40) << label;
    if (!m.failure.empty()) {
      std::cout << "failed: " << m.failure.substr(0, 240) << "\n";
    } else {
      std::cout << std::right << std::fixed << std::setprecision(1) << std::setw(9) << m.median_ms << " ms"
                << std::setw(8) << std::setprecision(3) << m.median_ms / floor_ms << " x" << gemms << "GEMM"
                << std::setw(9) << std::setprecision(0) << gemm_flop * gemms / (m.median_ms * 1e9) << " TFLOP/s"
                << std::setw(10) << std::setprecision(2) << m.extra_peak_gib() << " GiB\n";
    }
    if (json.is_open())
      json << nlohmann::json{{"arm", label}, {"median_ms", m.median_ms}, {"gemms", gemms},
                             {"ratio_to_floor", m.failure.empty() ? m.median_ms / floor_ms : 0.0},
                             {"useful_tflops", m.failure.empty() ? gemm_flop * gemms / (m.median_ms * 1e9) : 0.0},
                             {"extra_peak_gib", m.extra_peak_gib()}, {"failure", m.failure},
                             {"rows", n}, {"hidden", h}, {"vocab", v}}
                  .dump()
           << "\n";
  };

  std::cout << "loss_bench: N=" << n << " H=" << h << " V=" << v << " bf16, frozen lm_head, "
            << static_cast<int>(torch::cuda::device_count()) << " GPU(s); median of " << args.repeats << " after " << args.warmup
            << " warm-ups\n";
  std::cout << std::left << std::setw(40) << "arm" << std::right << std::setw(12) << "time" << std::setw(15)
            << "ratio/floor" << std::setw(17) << "useful" << std::setw(14) << "extra peak\n";
  record("GEMM [N,H]x[H,V] (floor)", gemm, 1);
  // Diagnostics: the fused loss's GEMMs alone, in row chunks, with no
  // softmax arithmetic; the gap to the fused arms is what the kernels cost.
  for (const auto& gemms_and_chunk : std::vector<std::pair<int, int64_t>>{{2, 1024}, {2, 2048}, {3, 512}, {3, 1024}, {3, 2048}}) {
    const int gemms = gemms_and_chunk.first;  // named locals: a lambda may not capture structured bindings in C++17
    const int64_t chunk = gemms_and_chunk.second;
    auto dh = torch::empty({n, h}, bf16);
    const Measurement chunked = measure(args.warmup, args.repeats, [&] {
      torch::NoGradGuard no_grad;
      for (int64_t s = 0; s < n; s += chunk) {
        const int64_t rows = std::min<int64_t>(chunk, n - s);
        auto z = torch::matmul(hidden.narrow(0, s, rows), weight.t());
        if (gemms == 3) auto u = torch::matmul(teacher_hidden.narrow(0, s, rows), weight.t());
        auto out = dh.narrow(0, s, rows);
        torch::mm_out(out, z, weight);
      }
    });
    record(std::to_string(gemms) + " GEMMs in " + std::to_string(chunk) + "-row chunks only", chunked, gemms);
  }
  for (const Arm& arm : arms) {
    if (!args.only.empty() && std::find(args.only.begin(), args.only.end(), arm.plugin) == args.only.end()) continue;
    const PluginRecord* plugin = nullptr;
    try {
      plugin = &registry.find(DFLASH_KIND_LOSS, arm.plugin);
    } catch (const std::exception&) {
      std::cout << std::left << std::setw(40) << arm.label << "skipped: no plugin '" << arm.plugin << "' in --plugin-dir\n";
      continue;
    }
    // The plugin's defaults, then the arm's settings (as the host fills them).
    nlohmann::json config = arm.config;
    for (auto& [key, property] : plugin->schema.at("properties").items())
      if (!config.contains(key)) config[key] = property.at("default");
    LossInstance loss(*plugin, config, {"cuda:0", "bfloat16", 0});
    LossCall call{hidden, weight, targets, -100, row_weights, arm.teacher};
    if (arm.teacher == DFLASH_TEACHER_HIDDEN) call.teacher_hidden = teacher_hidden;
    if (arm.teacher == DFLASH_TEACHER_TOPK) {
      call.teacher_topk_ids = topk_ids;
      call.teacher_topk_logprobs = topk_logprobs;
    }
    const Measurement m = measure(args.warmup, args.repeats, [&] {
      hidden.mutable_grad() = torch::Tensor();
      LossOutput out = loss.compute(call);
      out.loss.backward();
    });
    record(arm.label, m, arm.gemms);
  }
  return 0;
}
