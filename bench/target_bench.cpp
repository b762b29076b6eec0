// Times the hf_decoder target's forward (through the plugin ABI, as the
// trainer calls it) on one GPU, beside floors measured in the same run: the
// same linear-layer GEMMs alone, flash attention alone, and cuBLAS's best on a
// large square GEMM. A program, not a test: docs/performance.md has the
// figures and bench/target_forward_transformers.py times the peer (and writes
// the random Hugging Face directory this program loads).
//
//   target_bench --plugin-dir build-gpu/lib/dflash-host/plugins --model DIR
//                [--batch 8 --seq 4096 --documents 4 --repeats 5 --warmup 2 --json out.jsonl]
//                [--blas default|cublas|cublaslt]   (LibTorch's preferred GEMM library, for every arm)
#include "bench_args.h"
#include "plugin/instances.h"
#include "plugin/registry.h"

#include "bench_support.h"

#include <ATen/Context.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

namespace {
using namespace dflash::host;
using dflash::bench::Measurement;
using dflash::bench::measure;

struct Args {
  std::string plugin_dir, model, json, blas = "default";
  int64_t batch = 8, seq = 4096, documents = 4;
  bool diagnostics = true, reference_arms = true;
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
    else if (r.is("--blas")) a.blas = r.text();
    else if (r.is("--no-diagnostics")) a.diagnostics = false;
    else if (r.is("--no-reference")) a.reference_arms = false;
    else r.unknown();
  }
  if (a.plugin_dir.empty() || a.model.empty()) throw std::invalid_argument("--plugin-dir DIR and --model DIR are required");
  if (a.documents < 1 || a.seq % a.documents != 0) throw std::invalid_argument("--documents must divide --seq");
  return a;
}


}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "target_bench: " << e.what() << "\n";
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "target_bench: no CUDA device\n";
    return 2;
  }
  if (args.blas == "cublas") at::globalContext().setBlasPreferredBackend(at::BlasBackend::Cublas);
  else if (args.blas == "cublaslt") at::globalContext().setBlasPreferredBackend(at::BlasBackend::Cublaslt);
  else if (args.blas != "default") {
    std::cerr << "target_bench: --blas takes default, cublas or cublaslt\n";
    return 2;
  }
  PluginRegistry registry;
  registry.add_directory(args.plugin_dir);
  const auto device = torch::Device(torch::kCUDA, 0);
  const auto bf16 = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  const int64_t b = args.batch, s = args.seq, n = b * s;

  std::ofstream json;
  if (!args.json.empty()) json.open(args.json);
  auto emit = [&](const std::string& label, const Measurement& m, double flop, double floor_ms) {
    std::cout << std::left << std::setw(44) << label;
    if (!m.failure.empty()) {
      std::cout << "failed: " << m.failure.substr(0, 240) << "\n";
    } else {
      std::cout << std::right << std::fixed << std::setprecision(1) << std::setw(9) << m.median_ms << " ms"
                << std::setw(11) << std::setprecision(0) << n / (m.median_ms / 1000) << " tok/s" << std::setw(8)
                << std::setprecision(3) << (floor_ms > 0 ? m.median_ms / floor_ms : 0.0) << " x floor" << std::setw(8)
                << std::setprecision(0) << flop / (m.median_ms * 1e9) << " TFLOP/s" << std::setw(9) << std::setprecision(2)
                << m.extra_peak_gib() << " GiB\n";
    }
    if (json.is_open())
      json << nlohmann::json{{"arm", label}, {"median_ms", m.median_ms}, {"tokens_per_s", m.failure.empty() ? n / (m.median_ms / 1000) : 0.0},
                             {"ratio_to_floor", floor_ms > 0 && m.failure.empty() ? m.median_ms / floor_ms : 0.0},
                             {"tflops", m.failure.empty() ? flop / (m.median_ms * 1e9) : 0.0},
                             {"extra_peak_gib", m.extra_peak_gib()}, {"failure", m.failure.substr(0, 240)}, {"batch", b}, {"seq", s}}
                  .dump()
           << "\n";
  };

  // Two instances share nothing: load, time, release, then the next.
  auto make_target = [&](const std::string& kernels, int streams, const std::string& attention) {
    return std::make_unique<TargetModelInstance>(
        registry.find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"),
        nlohmann::json{{"path", args.model}, {"dtype", "bfloat16"}, {"feature_layers", 5}, {"kernels", kernels},
                       {"streams", streams}, {"attention", attention}},
        InstanceOptions{"cuda:0", "bfloat16", 0});
  };
  auto target = make_target("auto", 2, "auto");
  const nlohmann::json info = target->describe();
  const int64_t layers = info.at("num_layers"), hidden = info.at("hidden_size"), heads = info.at("num_attention_heads");
  const int64_t kv_heads = info.at("num_key_value_heads"), head_dim = info.at("head_dim");
  const std::vector<int64_t> layer_ids = info.at("default_layer_ids").get<std::vector<int64_t>>();
  int64_t inter = 0;
  {
    std::ifstream in(args.model + "/config.json");
    inter = nlohmann::json::parse(in).at("intermediate_size").get<int64_t>();
  }
  const int64_t q_out = heads * head_dim, kv_out = kv_heads * head_dim;
  const double linear_flop = 2.0 * n * layers * (hidden * (q_out + 2 * kv_out) + q_out * hidden + hidden * 2 * inter + inter * hidden);
  const double attention_flop = 4.0 * b * (s * (s + args.documents) / 2.0 / args.documents) * heads * head_dim * layers;
  const double attention_flop_one = 4.0 * b * (s * (s + 1) / 2.0) * heads * head_dim * layers;

  std::cout << "target_bench: " << info.at("model_type").get<std::string>() << " " << layers << " layers, H " << hidden
            << ", " << heads << "/" << kv_heads << " heads x " << head_dim << ", MLP " << inter << ", batch " << b << " x "
            << s << " bf16, BLAS " << args.blas << ", hidden states of layers";
  for (int64_t id : layer_ids) std::cout << " " << id;
  std::cout << " + the last; median of " << args.repeats << " after " << args.warmup << " warm-ups\n";
  std::cout << "linear-layer FLOP per forward: " << linear_flop / 1e12 << " T; attention (causal, one document per row): "
            << attention_flop_one / 1e12 << " T\n";

  // Floors, same run.
  torch::manual_seed(0);
  Measurement square, gemms, flash_one, flash_packed, cudnn_one;
  std::vector<std::tuple<std::string, Measurement, double>> per_gemm, diagnostic;
  {
    torch::NoGradGuard no_grad;
    auto a = torch::randn({8192, 8192}, bf16), w = torch::randn({8192, 8192}, bf16);
    square = measure(args.warmup, args.repeats, [&] { auto c = torch::mm(a, w); });
    auto x = torch::randn({n, hidden}, bf16), attn = torch::randn({n, q_out}, bf16), act = torch::randn({n, inter}, bf16);
    auto w_qkv = torch::randn({q_out + 2 * kv_out, hidden}, bf16) * 0.02, w_o = torch::randn({hidden, q_out}, bf16) * 0.02;
    auto w_gu = torch::randn({2 * inter, hidden}, bf16) * 0.02, w_down = torch::randn({hidden, inter}, bf16) * 0.02;
    gemms = measure(args.warmup, args.repeats, [&] {
      for (int64_t l = 0; l < layers; ++l) {
        auto qkv = torch::mm(x, w_qkv.t());
        auto o = torch::mm(attn, w_o.t());
        auto gu = torch::mm(x, w_gu.t());
        auto down = torch::mm(act, w_down.t());
      }
    });
    struct Shape {
      std::string name;
      torch::Tensor in, weight;
    };
    for (const Shape& shape : std::vector<Shape>{{"qkv", x, w_qkv}, {"o", attn, w_o}, {"gate_up", x, w_gu}, {"down", act, w_down}}) {
      const Measurement m = measure(args.warmup, args.repeats, [&] {
        for (int64_t l = 0; l < layers; ++l) auto y = torch::mm(shape.in, shape.weight.t());
      });
      const double flop = 2.0 * n * shape.weight.size(0) * shape.weight.size(1) * layers;
      per_gemm.emplace_back("  GEMM " + shape.name + " [" + std::to_string(n) + "," + std::to_string(shape.weight.size(1)) + "]x[" +
                                std::to_string(shape.weight.size(1)) + "," + std::to_string(shape.weight.size(0)) + "] x" + std::to_string(layers),
                            m, flop);
    }
    auto q = torch::randn({n, heads, head_dim}, bf16), k = torch::randn({n, kv_heads, head_dim}, bf16);
    auto v = torch::randn({n, kv_heads, head_dim}, bf16);
    auto flash = [&](int64_t documents) {
      const int64_t length = s / documents;
      auto cu = torch::arange(0, n + 1, length, torch::TensorOptions().device(device).dtype(torch::kInt));
      return measure(args.warmup, args.repeats, [&] {
        for (int64_t l = 0; l < layers; ++l)
          auto out = at::_flash_attention_forward(q, k, v, cu, cu, length, length, 0.0, true, false);
      });
    };
    flash_one = flash(1);
    flash_packed = flash(args.documents);
    {
      auto qt = q.view({b, s, heads, head_dim}).transpose(1, 2), kt = k.view({b, s, kv_heads, head_dim}).transpose(1, 2);
      auto vt = v.view({b, s, kv_heads, head_dim}).transpose(1, 2);
      const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      cudnn_one = measure(args.warmup, args.repeats, [&] {
        for (int64_t l = 0; l < layers; ++l)
          auto out = at::_scaled_dot_product_cudnn_attention(qt, kt, vt, {}, false, 0.0, true, false, scale);
      });
    }
    if (args.diagnostics) {
      // Other attention kernels LibTorch has, through SDPA with one backend enabled at a time.
      auto& context = at::globalContext();
      auto qt = q.view({b, s, heads, head_dim}).transpose(1, 2), kt = k.view({b, s, kv_heads, head_dim}).transpose(1, 2);
      auto vt = v.view({b, s, kv_heads, head_dim}).transpose(1, 2);
      auto k_rep = kt.repeat_interleave(heads / kv_heads, 1), v_rep = vt.repeat_interleave(heads / kv_heads, 1);
      auto only = [&](bool flash_on, bool cudnn_on, bool efficient_on) {
        context.setSDPUseFlash(flash_on);
        context.setSDPUseCuDNN(cudnn_on);
        context.setSDPUseMemEfficient(efficient_on);
        context.setSDPUseMath(false);
      };
      auto sdpa = [&](bool gqa) {
        return measure(args.warmup, args.repeats, [&] {
          for (int64_t l = 0; l < layers; ++l)
            auto out = gqa ? at::scaled_dot_product_attention(qt, kt, vt, {}, 0.0, true, std::nullopt, true)
                           : at::scaled_dot_product_attention(qt, k_rep, v_rep, {}, 0.0, true);
        });
      };
      only(false, true, false);
      diagnostic.emplace_back("  SDPA cuDNN, GQA, 1 doc/row", sdpa(true), attention_flop_one);
      diagnostic.emplace_back("  SDPA cuDNN, K/V repeated, 1 doc/row", sdpa(false), attention_flop_one);
      only(true, false, false);
      diagnostic.emplace_back("  SDPA flash, GQA, 1 doc/row", sdpa(true), attention_flop_one);
      only(true, true, true);
      context.setSDPUseMath(true);
      // The residual add inside the GEMM (beta = 1), and weights stored [in, out].
      auto residual = torch::randn({n, hidden}, bf16);
      diagnostic.emplace_back("  GEMM o with residual (addmm_, beta 1) x" + std::to_string(layers), measure(args.warmup, args.repeats, [&] {
        for (int64_t l = 0; l < layers; ++l) residual.addmm_(attn, w_o.t());
      }), 2.0 * n * hidden * q_out * layers);
      auto w_gu_nn = w_gu.t().contiguous();
      diagnostic.emplace_back("  GEMM gate_up, weight [in,out] x" + std::to_string(layers), measure(args.warmup, args.repeats, [&] {
        for (int64_t l = 0; l < layers; ++l) auto y = torch::mm(x, w_gu_nn);
      }), 2.0 * n * hidden * 2 * inter * layers);
      diagnostic.emplace_back("  GEMM 8192^3 sustained (x200)", measure(args.warmup, args.repeats, [&] {
        for (int i = 0; i < 200; ++i) auto c = torch::mm(a, w);
      }), 200 * 2.0 * 8192.0 * 8192.0 * 8192.0);
    }
  }
  std::cout << std::left << std::setw(44) << "arm" << std::right << std::setw(12) << "time" << std::setw(17) << "throughput"
            << std::setw(16) << "ratio" << std::setw(16) << "useful" << std::setw(13) << "extra peak\n";
  emit("cuBLAS 8192^3 GEMM (peak reference)", square, 2.0 * 8192.0 * 8192.0 * 8192.0, 0);
  emit("linear-layer GEMMs alone (floor part 1)", gemms, linear_flop, 0);
  for (const auto& [label, m, flop] : per_gemm) emit(label, m, flop, 0);
  emit("cuDNN attention alone, 1 doc/row (part 2)", cudnn_one, attention_flop_one, 0);
  emit("flash attention alone, 1 doc/row", flash_one, attention_flop_one, 0);
  emit("flash attention alone, " + std::to_string(args.documents) + " docs/row", flash_packed, attention_flop, 0);
  for (const auto& [label, m, flop] : diagnostic) emit(label, m, flop, 0);
  // Each arm's floor: the GEMMs plus the attention kernel it uses, alone.
  const double floor_cudnn = gemms.median_ms + cudnn_one.median_ms, floor_one = gemms.median_ms + flash_one.median_ms;
  const double floor_packed = gemms.median_ms + flash_packed.median_ms;

  auto ids = torch::randint(0, info.at("vocab_size").get<int64_t>(), {b, s}, torch::TensorOptions().dtype(torch::kLong)).to(device);
  auto packed_positions = torch::arange(s / args.documents, torch::TensorOptions().dtype(torch::kLong))
                              .repeat({args.documents}).unsqueeze(0).expand({b, s}).contiguous().to(device);
  auto time_forward = [&](TargetModelInstance& t, bool packed) {
    NamedTensors batch = {{"input_ids", ids}};
    if (packed) batch.emplace_back("position_ids", packed_positions);
    return measure(args.warmup, args.repeats, [&] { auto out = t.forward(batch, layer_ids, /*want_last_hidden=*/true, /*want_logits=*/false); });
  };
  // Linear FLOP are the useful work the throughput figure reports (as the peer's 424 TFLOP/s does).
  if (!target->describe().at("cudnn_attention").get<bool>()) std::cout << "(cuDNN attention unavailable: flash in every arm)\n";
  emit("hf_decoder (kernels+cuDNN, 2 streams), 1 doc/row", time_forward(*target, false), linear_flop, floor_cudnn);
  emit("hf_decoder (kernels+flash, 2 streams), " + std::to_string(args.documents) + " docs/row", time_forward(*target, true), linear_flop, floor_packed);
  target.reset();
  c10::cuda::CUDACachingAllocator::emptyCache();
  if (!args.reference_arms) return 0;
  {
    auto other = make_target("auto", 1, "auto");
    emit("hf_decoder (kernels+cuDNN, 1 stream), 1 doc/row", time_forward(*other, false), linear_flop, floor_cudnn);
  }
  {
    auto other = make_target("auto", 2, "flash");
    emit("hf_decoder (kernels+flash, 2 streams), 1 doc/row", time_forward(*other, false), linear_flop, floor_one);
  }
  c10::cuda::CUDACachingAllocator::emptyCache();
  auto reference = make_target("aten", 1, "auto");
  emit("hf_decoder (ATen path), 1 doc/row", time_forward(*reference, false), linear_flop, floor_one);
  emit("hf_decoder (ATen path), " + std::to_string(args.documents) + " docs/row", time_forward(*reference, true), linear_flop, floor_packed);
  return 0;
}
