// Times the hf_hybrid target's forward (through the plugin ABI, as the
// trainer calls it) at the Qwen3.6-27B shape on one GPU, and the gated delta
// rule alone (plugins/target/hf_hybrid/gated_deltanet.cpp, compiled in) at
// one linear layer's shape. A program, not a test: the peer side is
// bench/hybrid_forward_transformers.py (transformers, and FLA's chunked
// kernel), which also writes the random Hugging Face directory this program
// loads; scripts/device_hybrid_bench.sh runs both in one call and
// docs/performance.md has the figures.
//
//   hybrid_bench --plugin-dir build-gpu/lib/dflash-host/plugins [--model DIR]
//                [--batch 8 --seq 4096 --documents 1 --repeats 5 --warmup 2 --json out.jsonl]
// Without --model, only the delta rule's arm runs.
#include "bench_args.h"
#include "bench_support.h"
#include "plugin/instances.h"
#include "plugin/registry.h"

#include "../plugins/target/hf_hybrid/gated_deltanet.h"

#include <torch/torch.h>

#include <fstream>
#include <iomanip>
#include <iostream>

namespace {
using namespace dflash::host;
using dflash::bench::Measurement;
using dflash::bench::measure;

struct Args {
  std::string plugin_dir, model, json;
  int64_t batch = 8, seq = 4096, documents = 1;
  int repeats = 5, warmup = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  dflash::bench::FlagReader r(argc, argv);
  while (r.next()) {
    if (r.is("--plugin-dir")) a.plugin_dir = r.text();
    else if (r.is("--model")) a.model = r.text();
    else if (r.is("--batch")) a.batch = r.integer();
    else if (r.is("--seq")) a.seq = r.integer();
    else if (r.is("--documents")) a.documents = r.integer();
    else if (r.is("--repeats")) a.repeats = static_cast<int>(r.integer());
    else if (r.is("--warmup")) a.warmup = static_cast<int>(r.integer());
    else if (r.is("--json")) a.json = r.text();
    else r.unknown();
  }
  if (a.plugin_dir.empty()) throw std::invalid_argument("--plugin-dir DIR is required");
  if (a.documents < 1 || a.seq % a.documents != 0) throw std::invalid_argument("--documents must divide --seq");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "hybrid_bench: " << e.what() << "\n";
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "hybrid_bench: no CUDA device\n";
    return 2;
  }
  const auto device = torch::Device(torch::kCUDA, 0);
  const auto bf16 = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  const int64_t b = args.batch, s = args.seq, n = b * s;
  std::ofstream json;
  if (!args.json.empty()) json.open(args.json);
  auto emit = [&](const std::string& label, const Measurement& m) {
    std::cout << std::left << std::setw(52) << label;
    if (!m.failure.empty()) std::cout << "failed: " << m.failure.substr(0, 240) << "\n";
    else
      std::cout << std::right << std::fixed << std::setprecision(1) << std::setw(9) << m.median_ms << " ms" << std::setw(11)
                << std::setprecision(0) << n / (m.median_ms / 1000) << " tok/s" << std::setw(9) << std::setprecision(2)
                << m.extra_peak_gib() << " GiB\n";
    if (json.is_open())
      json << nlohmann::json{{"arm", label}, {"median_ms", m.median_ms}, {"extra_peak_gib", m.extra_peak_gib()},
                             {"failure", m.failure.substr(0, 240)}, {"batch", b}, {"seq", s}, {"documents", args.documents}}
                  .dump()
           << "\n";
  };

  if (!args.model.empty()) {  // without --model: the delta rule alone
    PluginRegistry registry;
    registry.add_directory(args.plugin_dir);
    TargetModelInstance target(registry.find(DFLASH_KIND_TARGET_MODEL, "hf_hybrid"),
                               nlohmann::json{{"path", args.model}, {"dtype", "bfloat16"}, {"feature_layers", 5}},
                               InstanceOptions{"cuda:0", "bfloat16", 0});
    const nlohmann::json info = target.describe();
    std::vector<int64_t> all;
    for (int64_t i = 0; i < info.at("num_layers").get<int64_t>(); ++i) all.push_back(i);
    torch::manual_seed(0);
    const auto ids = torch::randint(info.at("vocab_size").get<int64_t>(), {b, s}, bf16.dtype(torch::kLong));
    NamedTensors batch = {{"input_ids", ids}};
    if (args.documents > 1)
      batch.emplace_back("position_ids", torch::arange(s / args.documents, bf16.dtype(torch::kLong)).repeat({b, args.documents}));
    std::cout << "hybrid_bench: " << info.at("model_type").get<std::string>() << ", " << all.size() << " layers "
              << info.at("layer_types").dump() << ", H " << info.at("hidden_size") << ", batch " << b << " x " << s
              << " (" << args.documents << " documents a row), bf16; median of " << args.repeats << " after "
              << args.warmup << " warm-ups\n";
    const Measurement forward = measure(args.warmup, args.repeats, [&] { auto out = target.forward(batch, all, true, false); });
    emit("hf_hybrid forward, every layer's hidden state", forward);
    // The planner's figure for the same forward (plan_hybrid_memory): its
    // working memory, beside the measured peak less the returned states.
    const nlohmann::json plugin_config{{"path", args.model}, {"dtype", "bfloat16"}, {"feature_layers", 5}};
    const PluginMemoryPlan plan = plan_memory(registry.find(DFLASH_KIND_TARGET_MODEL, "hf_hybrid"), plugin_config,
                                              InstanceOptions{"cuda:0", "bfloat16", 0},
                                              nlohmann::json{{"rows", b}, {"row_length", s}});
    double planned = 0;
    for (const auto& item : plan.items)
      if (item.phase == DFLASH_MEMORY_TARGET_FORWARD) planned += static_cast<double>(item.bytes);
    const double returned = static_cast<double>(all.size() + 1) * n * info.at("hidden_size").get<double>() * 2;
    const double measured = static_cast<double>(forward.extra_peak_bytes) - returned;
    std::cout << "forward working memory: planned " << planned / (1 << 30) << " GiB, measured " << measured / (1 << 30)
              << " GiB (peak less the " << returned / (1 << 30) << " GiB of returned states), planned/measured "
              << planned / measured << "\n";
    if (json.is_open())
      json << nlohmann::json{{"arm", "planner"}, {"planned_bytes", planned}, {"measured_bytes", measured},
                             {"documents", args.documents}}.dump() << "\n";
  }
  {
    // One linear layer's gated delta rule, as the Python side times it.
    torch::NoGradGuard no_grad;
    torch::manual_seed(1);
    const int64_t hk = 16, hv = 48, d = 128;
    auto q = torch::randn({b, s, hk, d}, bf16), k = torch::randn({b, s, hk, d}, bf16), v = torch::randn({b, s, hv, d}, bf16);
    auto g = -torch::rand({b, s, hv}, bf16.dtype(torch::kFloat)) * 0.5;
    auto beta = torch::rand({b, s, hv}, bf16);
    emit("delta rule: gdn::chunked_delta_rule (ATen)", measure(args.warmup, args.repeats, [&] {
           auto out = dflash::target::gdn::chunked_delta_rule(q, k, v, g, beta, {}, {});
         }));
  }
  return 0;
}
