// Times the hf_hybrid target's forward (through the plugin ABI, as the
// trainer calls it) at the Qwen3.6-27B shape on one GPU, and the gated delta
// rule alone (plugins/target/hf_hybrid/gated_deltanet.cpp, compiled in) at
// one linear layer's shape. A program, not a test: the peer side is
// bench/hybrid_forward_transformers.py (transformers, and FLA's chunked
// kernel), which also writes the random Hugging Face directory this program
// loads; scripts/device/hybrid_bench.sh runs both in one call and
// docs/performance.md has the figures.
//
//   hybrid_bench --plugin-dir build-gpu/lib/dflash-host/plugins [--model DIR]
//                [--batch 8 --seq 4096 --documents 1 --repeats 5 --warmup 2 --json out.jsonl]
//                [--profile N]
// Without --model, only the delta rule's arm runs.
//
// --profile N (0, the default, is off): after each arm's timed calls, one more
// call under LibTorch's Kineto profiler, and the N CUDA kernels with the most
// device time in it (name, launches, total ms, share of all kernels' time),
// with the total of every kernel; also as JSON lines {"arm": "profile", ...}
// in the --json file. Where this LibTorch cannot profile CUDA (no Kineto, no
// CUPTI) it says so and the timings stand.
#include "bench_args.h"
#include "bench_support.h"
#include "plugin/instances.h"
#include "plugin/registry.h"

#include "../plugins/target/hf_hybrid/gated_deltanet.h"

#include <torch/torch.h>

// The Kineto profiler's C++ API (as bench/kineto_trace.cpp uses it); without
// the header, --profile only says it cannot profile.
#if __has_include(<torch/csrc/autograd/profiler_kineto.h>)
#include <torch/csrc/autograd/profiler_kineto.h>
#define HYBRID_BENCH_KINETO 1
#else
#define HYBRID_BENCH_KINETO 0
#endif

#include <algorithm>
#include <exception>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace {
using namespace dflash::host;
using dflash::bench::Measurement;
using dflash::bench::measure;

struct Args {
  std::string plugin_dir, model, json;
  int64_t batch = 8, seq = 4096, documents = 1;
  int repeats = 5, warmup = 2;
  int64_t profile = 0;  // how many kernels --profile lists; 0: no profiled call
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
    else if (r.is("--profile")) a.profile = r.integer();
    else r.unknown();
  }
  if (a.plugin_dir.empty()) throw std::invalid_argument("--plugin-dir DIR is required");
  if (a.documents < 1 || a.seq % a.documents != 0) throw std::invalid_argument("--documents must divide --seq");
  if (a.profile < 0) throw std::invalid_argument("--profile takes a count of kernels, 0 for none");
  return a;
}

// One kernel's (by name) device time in a profiled call.
struct KernelTime {
  std::string name;
  int64_t launches = 0;
  double ns = 0;
};

// Where one call's device time went, kernel by kernel, largest first.
struct KernelProfile {
  std::vector<KernelTime> kernels;
  double kernel_ns = 0;  // every kernel's time, summed (not the wall time: streams may overlap)
  double copy_ns = 0;    // memcpy and memset on the device, apart from the kernels
  int64_t launches = 0;
  std::string failure;  // why there is no profile; empty when there is one
};

#if HYBRID_BENCH_KINETO
// LibTorch 2.1 and later give an event's duration in ns (durationNs), 2.0 and
// earlier in µs (durationUs): whichever this LibTorch's KinetoEvent has.
template <class Event>
auto duration_ns(const Event& e, int) -> decltype(static_cast<double>(e.durationNs())) {
  return static_cast<double>(e.durationNs());
}
template <class Event>
double duration_ns(const Event& e, long) {
  return static_cast<double>(e.durationUs()) * 1e3;
}
#endif

// Runs `body` once under the Kineto profiler (CPU and CUDA activities) and
// sums the device time of its CUDA kernels by name. Never throws: a profiler
// that does not start, a body that throws, or a trace without a kernel gives
// a profile whose `failure` says so.
KernelProfile profile_kernels(const std::function<void()>& body) {
  KernelProfile p;
#if HYBRID_BENCH_KINETO
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities = {ActivityType::CPU, ActivityType::CUDA};
  try {
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    p.failure = std::string("the profiler did not start: ") + e.what();
    return p;
  }
  std::string body_failure;
  try {
    body();
    torch::cuda::synchronize();
  } catch (const std::exception& e) {
    body_failure = e.what();
  }
  std::unique_ptr<profiler::ProfilerResult> result;
  try {
    result = profiler::disableProfiler();
  } catch (const std::exception& e) {
    p.failure = std::string("the profiler did not stop: ") + e.what();
  }
  if (!body_failure.empty()) {
    p.failure = "the profiled call threw: " + body_failure;
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
  if (!p.failure.empty() || !result) {
    if (p.failure.empty()) p.failure = "the profiler returned no result";
    p.failure.resize(std::min(p.failure.size(), p.failure.find('\n')));
    return p;
  }
  // KinetoEvent::activityType() is libkineto::ActivityType's value, whose
  // header LibTorch does not install; these numbers have been fixed in it
  // since Kineto's first release.
  constexpr uint8_t kGpuMemcpy = 3, kGpuMemset = 4, kConcurrentKernel = 5;
  std::map<std::string, KernelTime> by_name;
  for (const auto& e : result->events()) {
    const uint8_t type = e.activityType();
    if (type == kGpuMemcpy || type == kGpuMemset) {
      p.copy_ns += duration_ns(e, 0);
      continue;
    }
    if (type != kConcurrentKernel) continue;
    const double ns = duration_ns(e, 0);
    KernelTime& k = by_name[e.name()];
    k.launches += 1;
    k.ns += ns;
    p.launches += 1;
    p.kernel_ns += ns;
  }
  for (auto& [name, k] : by_name) {
    k.name = name;
    p.kernels.push_back(std::move(k));
  }
  std::sort(p.kernels.begin(), p.kernels.end(), [](const KernelTime& a, const KernelTime& b) { return a.ns > b.ns; });
  if (p.launches == 0)
    p.failure = "no CUDA kernel in the trace (is this LibTorch built with Kineto and CUPTI?)";
#else
  (void)body;
  p.failure = "this LibTorch has no Kineto profiler (torch/csrc/autograd/profiler_kineto.h)";
#endif
  return p;
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
  // --profile: `call` once more under the profiler, after `label`'s timed
  // calls (`timed`; skipped where they failed), and its heaviest kernels.
  auto profile = [&](const std::string& label, const Measurement& timed, const std::function<void()>& call) {
    if (args.profile <= 0) return;
    KernelProfile p;
    if (!timed.failure.empty()) p.failure = "not profiled: the timed calls failed";
    else p = profile_kernels(call);
    std::cout << "profile of " << label << ":";
    if (!p.failure.empty()) std::cout << " " << p.failure.substr(0, 240) << "\n";
    else
      std::cout << std::fixed << std::setprecision(2) << " CUDA kernels " << p.kernel_ns / 1e6 << " ms in " << p.launches
                << " launches of " << p.kernels.size() << " kernels (memcpy/memset " << p.copy_ns / 1e6 << " ms)\n";
    const size_t top = std::min(p.kernels.size(), static_cast<size_t>(args.profile));
    if (top > 0)
      std::cout << "  " << std::right << std::setw(10) << "total ms" << std::setw(7) << "share" << std::setw(8) << "count"
                << "  kernel\n";
    for (size_t i = 0; i < top; ++i) {
      const KernelTime& k = p.kernels[i];
      const std::string shown = k.name.size() > 90 ? k.name.substr(0, 87) + "..." : k.name;
      std::cout << "  " << std::right << std::fixed << std::setprecision(2) << std::setw(10) << k.ns / 1e6
                << std::setprecision(1) << std::setw(6) << 100 * k.ns / p.kernel_ns << "%" << std::setw(8) << k.launches
                << "  " << shown << "\n";
    }
    if (!json.is_open()) return;
    json << nlohmann::json{{"arm", "profile"}, {"of", label}, {"kernel_total_ms", p.kernel_ns / 1e6},
                           {"copy_ms", p.copy_ns / 1e6}, {"launches", p.launches}, {"kernels", p.kernels.size()},
                           {"failure", p.failure.substr(0, 240)}, {"batch", b}, {"seq", s}, {"documents", args.documents}}
                .dump()
         << "\n";
    for (size_t i = 0; i < top; ++i) {
      const KernelTime& k = p.kernels[i];
      json << nlohmann::json{{"arm", "profile"}, {"of", label}, {"rank", i + 1}, {"kernel", k.name.substr(0, 400)},
                             {"count", k.launches}, {"total_ms", k.ns / 1e6}, {"share", k.ns / p.kernel_ns},
                             {"batch", b}, {"seq", s}, {"documents", args.documents}}
                  .dump()
           << "\n";
    }
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
    const auto call_forward = [&] { auto out = target.forward(batch, all, true, false); };
    const Measurement forward = measure(args.warmup, args.repeats, call_forward);
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
    profile("hf_hybrid forward, every layer's hidden state", forward, call_forward);
  }
  {
    // One linear layer's gated delta rule, as the Python side times it.
    torch::NoGradGuard no_grad;
    torch::manual_seed(1);
    const int64_t hk = 16, hv = 48, d = 128;
    auto q = torch::randn({b, s, hk, d}, bf16), k = torch::randn({b, s, hk, d}, bf16), v = torch::randn({b, s, hv, d}, bf16);
    auto g = -torch::rand({b, s, hv}, bf16.dtype(torch::kFloat)) * 0.5;
    auto beta = torch::rand({b, s, hv}, bf16);
    // The CUDA kernels (what the forward runs in bf16 on CUDA), then the ATen
    // form they replace, on the same inputs.
    namespace gdn = dflash::target::gdn;
    if (gdn::kernels_take(v, hk, hv, d, d)) {
      // The call alone builds the rows' chunk plan and uploads it, a copy
      // from pageable memory that waits for the stream; the forward builds it
      // once a batch for all its linear layers, so a layer's own cost is the
      // second arm's.
      const auto call_kernels = [&] { auto out = gdn::chunked_delta_rule(q, k, v, g, beta, {}, {}); };
      const Measurement kernels = measure(args.warmup, args.repeats, call_kernels);
      emit("delta rule: gdn::chunked_delta_rule (CUDA kernels)", kernels);
      profile("delta rule: gdn::chunked_delta_rule (CUDA kernels)", kernels, call_kernels);
      const dflash::kernel_ops::DeltaChunkPlan plan = dflash::kernel_ops::plan_delta_chunks({}, b, s, v.device());
      const auto call_planned = [&] { auto out = gdn::chunked_delta_rule(q, k, v, g, beta, {}, {}, 64, &plan); };
      emit("delta rule: CUDA kernels, the plan built once a batch",
           measure(args.warmup, args.repeats, call_planned));
    } else {
      std::cout << "delta rule: this build has no CUDA kernels\n";
    }
    const auto call_rule = [&] {
      auto out = gdn::chunked_delta_rule(q, k, v, g, beta, {}, {}, 64, nullptr, /*reference=*/true);
    };
    const Measurement rule = measure(args.warmup, args.repeats, call_rule);
    emit("delta rule: gdn::chunked_delta_rule (ATen)", rule);
    profile("delta rule: gdn::chunked_delta_rule (ATen)", rule, call_rule);
  }
  return 0;
}
