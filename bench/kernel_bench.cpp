// Times, one launch at a time, the kernels of a decoding step at the row
// counts decoding uses (1: a token alone; 16: a verified block; 17 to 129: a
// draft tree's nodes and the newest token): cuBLAS's GEMMs against exact
// decoding's row-invariant linear kernel (with the rate its weights stream
// at; again with its runs of k added in clusters and in blocks of four
// warpgroups, each checked for the default's bits), and, at 1 and 16 rows, flash
// attention over the pool against the row-invariant decoding attention; at
// 17 to 129 rows, that attention over a draft tree's nodes (its cost beside
// the 16-row block's is part of what a tree step adds); at every row count,
// that attention again under other tilings of its blocks. Each
// arm is captured as a CUDA graph of --iters launches and replayed, so the
// figures are device time per launch as a decoding graph sees it, host
// launch cost excluded. A program, not a test: docs/performance.md has the
// figures. Shapes default to the GPU demo's target (scripts/gpu_demo).
//
//   kernel_bench [--hidden 512 --intermediate 1536 --heads 8 --kv-heads 4 --head-dim 64 --vocab 8192]
//                [--keys 512 --capacity 2048 --iters 200 --json out.json]
#include "bench_args.h"

#include <kernel_ops.h>
#include <pending_trees.h>

#include <nlohmann/json.hpp>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace {

struct Args {
  int64_t hidden = 512, intermediate = 1536, heads = 8, kv_heads = 4, head_dim = 64, vocab = 8192;
  int64_t keys = 512, capacity = 2048, iters = 200;
  std::string json;
};

Args parse(int argc, char** argv) {
  Args a;
  dflash::bench::FlagReader r(argc, argv);
  while (r.next()) {
    if (r.is("--hidden")) a.hidden = r.integer();
    else if (r.is("--intermediate")) a.intermediate = r.integer();
    else if (r.is("--heads")) a.heads = r.integer();
    else if (r.is("--kv-heads")) a.kv_heads = r.integer();
    else if (r.is("--head-dim")) a.head_dim = r.integer();
    else if (r.is("--vocab")) a.vocab = r.integer();
    else if (r.is("--keys")) a.keys = r.integer();
    else if (r.is("--capacity")) a.capacity = r.integer();
    else if (r.is("--iters")) a.iters = r.integer();
    else if (r.is("--json")) a.json = r.text();
    else r.unknown();
  }
  if (a.keys < 16 || a.keys > a.capacity) throw std::invalid_argument("--keys must lie in [16, --capacity]");
  return a;
}

// Device microseconds per call of `body`: a graph of `iters` calls, replayed
// once to warm up and once timed.
double microseconds(int64_t iters, const std::function<void()>& body) {
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard on(stream);
  body();  // eager first: lazy initialisation stays out of the capture
  stream.synchronize();
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  for (int64_t i = 0; i < iters; ++i) body();
  graph.capture_end();
  graph.replay();
  at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
  start.record(stream);
  graph.replay();
  end.record(stream);
  end.synchronize();
  return 1e3 * static_cast<double>(start.elapsed_time(end)) / static_cast<double>(iters);
}

// The attention's other block tilings (caps on a block's query heads and
// queries, AttentionTiling), each timed beside the default's: the figures a
// change of the default is chosen from. A query's bits are the same under
// every one (InvariantAttentionEmulated.AQuerysBitsDoNotDependOnHowBlocksTileTheQueries).
// The caps alone (min_blocks 0), the compiled maxima last.
const std::vector<dflash::cuda_kernels::AttentionTiling> kOtherTilings = {
    {1, 1, 0}, {1, 2, 0}, {1, 4, 0}, {1, 8, 0}, {2, 1, 0}, {2, 2, 0}, {2, 4, 0}, {4, 4, 0}, {4, 8, 0}};

// µs of `attend` under each of kOtherTilings, printed on one line after `label` and
// returned as JSON records.
nlohmann::json time_tilings(const char* label, int64_t rows, int64_t iters,
                            const std::function<void(const dflash::cuda_kernels::AttentionTiling&)>& attend) {
  nlohmann::json records = nlohmann::json::array();
  std::printf("%-8s (%3lld) tilings, heads x queries a block:", label, static_cast<long long>(rows));
  for (const dflash::cuda_kernels::AttentionTiling& t : kOtherTilings) {
    const double us = microseconds(iters, [&] { attend(t); });
    records.push_back({{"max_heads", t.max_heads}, {"max_queries", t.max_queries}, {"invariant_us", us}});
    std::printf(" %dx%d %.2f", t.max_heads, t.max_queries, us);
  }
  std::printf("\n");
  return records;
}

// The rate the weights (bf16) stream at, in GB/s: the memory floor's measure
// of a projection at decoding's row counts.
double weight_gb_per_s(int64_t elements, double microseconds) {
  return 2.0 * static_cast<double>(elements) / (microseconds * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kernel_bench: " << e.what() << "\n";
    return 2;
  }
  if (!torch::cuda::is_available() || !dflash::kernel_ops::available()) {
    std::cerr << "kernel_bench: needs a CUDA device and a build with the kernels\n";
    return 3;
  }
  const c10::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const int64_t q_out = a.heads * a.head_dim, kv_out = a.kv_heads * a.head_dim;
  struct Projection {
    std::string name;
    int64_t out, in;
  };
  const std::vector<Projection> projections = {{"qkv", q_out + 2 * kv_out, a.hidden}, {"o", a.hidden, q_out},
                                               {"gate_up", 2 * a.intermediate, a.hidden},
                                               {"down", a.hidden, a.intermediate}, {"lm_head", a.vocab, a.hidden}};
  nlohmann::json report = {{"shape", {{"hidden", a.hidden}, {"intermediate", a.intermediate}, {"heads", a.heads},
                                      {"kv_heads", a.kv_heads}, {"head_dim", a.head_dim}, {"vocab", a.vocab},
                                      {"keys", a.keys}, {"capacity", a.capacity}}},
                           {"iters", a.iters}, {"device", at::cuda::getCurrentDeviceProperties()->name}};
  const dflash::kernel_ops::InvariantLinearProducts products =
      dflash::kernel_ops::invariant_linear_products(torch::zeros({1}, options));
  report["invariant_linear_products"] = products.name();
  std::cout << "invariant linear: " << products.name() << " products\n";
  std::cout << "kernel (rows)              cuBLAS / flash us   invariant us\n";
  // Rows: a token alone, a chain's block, and draft trees of 16, 32, 64 and
  // 128 nodes with the newest token (one to nine 16-row tiles).
  for (const int64_t rows : {int64_t{1}, int64_t{16}, int64_t{17}, int64_t{33}, int64_t{65}, int64_t{129}}) {
    for (const Projection& p : projections) {
      const at::Tensor x = torch::randn({rows, p.in}, options), w = torch::randn({p.out, p.in}, options) * 0.02;
      const double cublas = microseconds(a.iters, [&] { (void)at::linear(x, w); });
      // The invariant linear under the process's current settings.
      const auto time_invariant = [&] {
        return microseconds(a.iters, [&] { (void)dflash::kernel_ops::invariant_linear(x, w); });
      };
      const double invariant = time_invariant();
      // A sanity check beside the times (the tests hold the real ones): the
      // invariant result within bf16 rounding of cuBLAS's, and its last row
      // bitwise the same computed alone.
      const at::Tensor ours = dflash::kernel_ops::invariant_linear(x, w), theirs = at::linear(x, w);
      const double error = ((ours - theirs).abs().max() / theirs.abs().max()).item<double>();
      const bool alone = at::equal(dflash::kernel_ops::invariant_linear(x.narrow(0, rows - 1, 1).contiguous(), w),
                                   ours.narrow(0, rows - 1, 1));
      // The runs of k added in clusters of up to 16 and of up to 8 blocks
      // (the default adds them through the workspace): the same bits.
      dflash::kernel_ops::set_invariant_linear_most_cluster_runs(16);
      const bool in_cluster = dflash::kernel_ops::invariant_linear_adds_runs_in_cluster(x, w);
      const double cluster_16 = time_invariant();
      const bool same_in_cluster = at::equal(dflash::kernel_ops::invariant_linear(x, w), ours);
      dflash::kernel_ops::set_invariant_linear_most_cluster_runs(8);
      const double cluster_8 = time_invariant();
      dflash::kernel_ops::set_invariant_linear_most_cluster_runs(1);
      // Blocks of four warpgroups (256 features; up to 80 rows a block), the
      // same bits as two (the default) — where the warpgroup products run.
      double four_warpgroups = 0;
      bool same_in_four = true;
      if (products.wgmma) {
        dflash::kernel_ops::set_invariant_linear_warpgroups(4);
        four_warpgroups = time_invariant();
        same_in_four = at::equal(dflash::kernel_ops::invariant_linear(x, w), ours);
        dflash::kernel_ops::set_invariant_linear_warpgroups(2);
      }
      report["linear"].push_back({{"name", p.name}, {"rows", rows}, {"out", p.out}, {"in", p.in},
                                  {"cublas_us", cublas}, {"invariant_us", invariant},
                                  {"invariant_weight_gb_per_s", weight_gb_per_s(p.out * p.in, invariant)},
                                  {"relative_error_to_cublas", error}, {"last_row_alone_identical", alone},
                                  {"runs_can_add_in_cluster", in_cluster}, {"clusters_of_16_us", cluster_16},
                                  {"clusters_of_8_us", cluster_8}, {"cluster_bits_identical", same_in_cluster},
                                  {"four_warpgroups_us", four_warpgroups}, {"four_warpgroups_bits_identical", same_in_four}});
      std::printf("%-8s (%3lld)               %8.2f      %8.2f   %6.0f GB/s of weights, error %.1e, row alone %s; "
                  "runs added in clusters of up to 16 %.2f%s, of up to 8 %.2f; four warpgroups %.2f (%s)\n",
                  p.name.c_str(), static_cast<long long>(rows), cublas, invariant,
                  weight_gb_per_s(p.out * p.in, invariant), error, alone ? "identical" : "DIFFERENT", cluster_16,
                  in_cluster ? (same_in_cluster ? " (same bits)" : " (DIFFERENT bits)") : " (no cluster)", cluster_8,
                  four_warpgroups, same_in_four ? "same bits" : "DIFFERENT bits");
    }
    // Attention of `rows` new queries at the end of a session of `keys` keys, one pool row.
    const at::Tensor pool_k = torch::randn({a.capacity, a.kv_heads, a.head_dim}, options);
    const at::Tensor pool_v = torch::randn({a.capacity, a.kv_heads, a.head_dim}, options);
    const at::Tensor q = torch::randn({rows, a.heads, a.head_dim}, options);
    const auto ints = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt);
    const at::Tensor cu_q = torch::tensor({0, static_cast<int>(rows)}, ints);
    const at::Tensor cu_k = torch::tensor({0, static_cast<int>(a.capacity)}, ints);
    const at::Tensor seqused = torch::tensor({static_cast<int>(a.keys)}, ints);
    const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
    if (rows > 16) {
      // A draft tree of `rows` nodes (the newest token first) after the
      // session's keys − rows keys: a chain of 16 (as deep as a block),
      // the other nodes hung off its first 15 in turn, as eval passes it.
      const int64_t before = a.keys - rows;
      if (before < 0) continue;  // --keys below the tree's nodes: no tree to time
      std::vector<int64_t> parents(static_cast<size_t>(rows), -1);
      for (int64_t i = 1; i < rows; ++i) parents[static_cast<size_t>(i)] = i < 16 ? i - 1 : (i - 16) % 15;
      const dflash::decode_support::TreePathRows paths =
          dflash::decode_support::tree_path_rows(parents, dflash::decode_support::tree_depths(parents), before);
      const at::Tensor tree_rows = torch::tensor(paths.rows, torch::kInt).view({rows, paths.stride}).to(torch::kCUDA);
      const at::Tensor lengths = torch::tensor(paths.lengths, torch::kInt).to(torch::kCUDA);
      const double tree = microseconds(a.iters, [&] {
        (void)dflash::kernel_ops::invariant_decode_attention(q, pool_k, pool_v, cu_k, seqused, rows, a.capacity, tree_rows,
                                                             lengths);
      });
      std::printf("%-8s (%3lld)                             %8.2f   a draft tree's nodes\n", "attn", static_cast<long long>(rows),
                  tree);
      const nlohmann::json tilings = time_tilings("attn", rows, a.iters, [&](const dflash::cuda_kernels::AttentionTiling& t) {
        (void)dflash::kernel_ops::invariant_decode_attention(q, pool_k, pool_v, cu_k, seqused, rows, a.capacity, tree_rows,
                                                             lengths, t);
      });
      report["tree_attention"].push_back({{"nodes", rows}, {"invariant_us", tree}, {"tilings", tilings}});
      continue;
    }
    const double flash = microseconds(a.iters, [&] {
      (void)at::_flash_attention_forward(q, pool_k, pool_v, cu_q, cu_k, rows, a.capacity, 0.0, rows > 1, false, scale,
                                         std::nullopt, std::nullopt, seqused);
    });
    const double invariant = microseconds(a.iters, [&] {
      (void)dflash::kernel_ops::invariant_decode_attention(q, pool_k, pool_v, cu_k, seqused, rows, a.capacity);
    });
    std::printf("%-8s (%3lld)               %8.2f      %8.2f\n", "attn", static_cast<long long>(rows), flash, invariant);
    const nlohmann::json tilings = time_tilings("attn", rows, a.iters, [&](const dflash::cuda_kernels::AttentionTiling& t) {
      (void)dflash::kernel_ops::invariant_decode_attention(q, pool_k, pool_v, cu_k, seqused, rows, a.capacity, {}, {}, t);
    });
    report["attention"].push_back({{"rows", rows}, {"flash_us", flash}, {"invariant_us", invariant}, {"tilings", tilings}});
  }
  if (!a.json.empty()) std::ofstream(a.json) << report.dump(2) << "\n";
  return 0;
}
