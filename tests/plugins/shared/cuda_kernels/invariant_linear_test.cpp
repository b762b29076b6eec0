// kernel_ops::invariant_linear on the GPU: the product within bf16 rounding
// of fp32's, and every row bitwise what it gets alone or among other row
// counts, for shapes summed in one run of k and in several (through the
// workspace and a second kernel, or, where allowed, in a cluster of the runs'
// blocks), row counts of one to ten 16-row tiles.
#include <kernel_ops.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

struct Shape {
  int64_t out, in;
};

bool usable() { return dflash::kernel_ops::available() && at::hasCUDA(); }

TEST(InvariantLinear, ARowGetsTheSameBitsAtEveryRowCountAndTheProductIsRight) {
  if (!usable()) GTEST_SKIP() << "no CUDA kernels or no CUDA device";
  torch::manual_seed(3);
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  // One run of k (1100 × 64), two (300 × 520: a partial last chunk), and
  // the narrow projections of an 8B model (several runs, rows past a block).
  for (const Shape s : {Shape{1100, 64}, Shape{300, 520}, Shape{136, 1032}, Shape{4096, 8192}, Shape{8192, 2048}}) {
    SCOPED_TRACE("out " + std::to_string(s.out) + ", in " + std::to_string(s.in));
    const int64_t most = 150;
    const at::Tensor x = torch::randn({most, s.in}, bf16), w = torch::randn({s.out, s.in}, bf16) * 0.05;
    const at::Tensor bias = torch::randn({s.out}, bf16), residual = torch::randn({most, s.out}, bf16);
    const at::Tensor all = dflash::kernel_ops::invariant_linear(x, w, bias, residual);
    const at::Tensor reference = at::addmm(bias.to(at::kFloat), x.to(at::kFloat), w.to(at::kFloat).t()) +
                                 residual.to(at::kFloat);
    const double error = ((all.to(at::kFloat) - reference).abs().max() / reference.abs().max()).item<double>();
    EXPECT_LT(error, 1e-2);
    for (const int64_t rows : {int64_t{1}, int64_t{16}, int64_t{17}, int64_t{100}, int64_t{129}}) {
      // The last `rows` rows, so each sits at another place in its tiles than in `all`.
      const at::Tensor some = dflash::kernel_ops::invariant_linear(x.narrow(0, most - rows, rows).contiguous(), w, bias,
                                                                   residual.narrow(0, most - rows, rows).contiguous());
      EXPECT_TRUE(at::equal(some, all.narrow(0, most - rows, rows))) << rows << " rows";
    }
    // residual += x · wᵀ in place: the same bits as the out-of-place sum.
    at::Tensor in_place = residual.clone();
    dflash::kernel_ops::invariant_add_linear_(in_place, x, w);
    EXPECT_TRUE(at::equal(in_place, dflash::kernel_ops::invariant_linear(x, w, {}, residual)));
  }
}

// The build's choice of products against the device's own code: on a
// compute-capability 9.0 GPU the warpgroup products run exactly when the
// kernels' code there was compiled for sm_90a (a flag that missed its sm_90a
// code ran mma.sync unseen; one set without it would trap); elsewhere
// mma.sync runs, whatever was compiled.
TEST(InvariantLinear, RunsTheWarpgroupProductsWhereverItsDeviceCodeHasThem) {
  if (!usable()) GTEST_SKIP() << "no CUDA kernels or no CUDA device";
  const at::Tensor on = torch::zeros({1}, torch::TensorOptions().device(torch::kCUDA));
  const dflash::kernel_ops::InvariantLinearProducts products = dflash::kernel_ops::invariant_linear_products(on);
  const bool hopper = products.compute_capability == 90;
  std::cerr << "invariant_linear products: " << products.name() << " (device code "
            << (products.wgmma_in_device_code ? "with" : "without") << " wgmma, compute capability "
            << products.compute_capability << ")\n";
  EXPECT_EQ(products.wgmma, hopper && products.wgmma_in_device_code);
}

// Allowed clusters of 16 (the default allows none), with the warpgroup
// products on an H100 or H200, an 8B model's o projection (8 runs of k: a
// portable cluster) adds its runs in a cluster of their blocks, from one row
// to a 128-node tree's 129; a weight summed in one run needs no adding;
// elsewhere the workspace adds them. Whether 16 blocks of up to 209 KiB of
// shared memory each fit one cluster is the device's answer
// (cudaOccupancyMaxActiveClusters), printed for qkv's 16 runs. By default
// none adds in a cluster.
TEST(InvariantLinear, AddsTheRunsOfKInAClusterWhereAllowedAndTheWarpgroupProductsRun) {
  if (!usable()) GTEST_SKIP() << "no CUDA kernels or no CUDA device";
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const bool wgmma = dflash::kernel_ops::invariant_linear_products(torch::zeros({1}, bf16)).wgmma;
  EXPECT_FALSE(dflash::kernel_ops::invariant_linear_adds_runs_in_cluster(torch::zeros({16, 2048}, bf16),
                                                                          torch::zeros({8192, 2048}, bf16)));
  dflash::kernel_ops::set_invariant_linear_most_cluster_runs(16);
  for (const Shape s : {Shape{4096, 8192}, Shape{8192, 2048}, Shape{1100, 64}}) {
    const at::Tensor w = torch::zeros({s.out, s.in}, bf16);
    for (const int64_t rows : {int64_t{1}, int64_t{16}, int64_t{65}, int64_t{129}}) {
      const bool in_cluster = dflash::kernel_ops::invariant_linear_adds_runs_in_cluster(torch::zeros({rows, s.in}, bf16), w);
      std::cerr << "out " << s.out << ", in " << s.in << ", " << rows << " rows: runs added "
                << (in_cluster ? "in a cluster" : "through the workspace or not at all") << "\n";
      if (s.in == 8192) continue;  // 16 runs: the device's answer, printed above
      EXPECT_EQ(in_cluster, wgmma && s.in > 64) << "out " << s.out << ", in " << s.in << ", " << rows << " rows";
    }
  }
  dflash::kernel_ops::set_invariant_linear_most_cluster_runs(1);
}

// The cluster's adding and the workspace's are the same arithmetic (run 0's
// sum, then each later run's in run order, then bias and residual): every
// output bitwise the same both ways, at each row count, for 16, 8 and 2 runs.
TEST(InvariantLinear, ARunsSumsAddedInAClusterGiveTheWorkspacesBits) {
  if (!usable()) GTEST_SKIP() << "no CUDA kernels or no CUDA device";
  torch::manual_seed(5);
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  for (const Shape s : {Shape{4096, 8192}, Shape{8192, 2048}, Shape{300, 520}}) {
    const at::Tensor w = torch::randn({s.out, s.in}, bf16) * 0.05, bias = torch::randn({s.out}, bf16);
    for (const int64_t rows : {int64_t{1}, int64_t{16}, int64_t{65}, int64_t{150}}) {
      const at::Tensor x = torch::randn({rows, s.in}, bf16), residual = torch::randn({rows, s.out}, bf16);
      dflash::kernel_ops::set_invariant_linear_most_cluster_runs(16);
      const at::Tensor clustered = dflash::kernel_ops::invariant_linear(x, w, bias, residual);
      dflash::kernel_ops::set_invariant_linear_most_cluster_runs(1);
      EXPECT_FALSE(dflash::kernel_ops::invariant_linear_adds_runs_in_cluster(x, w));
      const at::Tensor through_workspace = dflash::kernel_ops::invariant_linear(x, w, bias, residual);
      EXPECT_TRUE(at::equal(clustered, through_workspace)) << "out " << s.out << ", in " << s.in << ", " << rows << " rows";
    }
  }
  EXPECT_THROW(dflash::kernel_ops::set_invariant_linear_most_cluster_runs(0), std::invalid_argument);
  EXPECT_THROW(dflash::kernel_ops::set_invariant_linear_most_cluster_runs(17), std::invalid_argument);
}

// Blocks of four warpgroups (256 features) against two: the same bits at
// every row count up to a 64-node tree's 65 (more rows keep two), where the
// warpgroup products run.
TEST(InvariantLinear, BlocksOfFourWarpgroupsGiveTheTwosBits) {
  if (!usable()) GTEST_SKIP() << "no CUDA kernels or no CUDA device";
  torch::manual_seed(7);
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  if (!dflash::kernel_ops::invariant_linear_products(torch::zeros({1}, bf16)).wgmma)
    GTEST_SKIP() << "the warpgroup products do not run here";
  for (const Shape s : {Shape{4096, 8192}, Shape{8192, 2048}, Shape{300, 520}}) {
    const at::Tensor w = torch::randn({s.out, s.in}, bf16) * 0.05, bias = torch::randn({s.out}, bf16);
    for (const int64_t rows : {int64_t{1}, int64_t{16}, int64_t{33}, int64_t{65}}) {
      const at::Tensor x = torch::randn({rows, s.in}, bf16), residual = torch::randn({rows, s.out}, bf16);
      const at::Tensor two = dflash::kernel_ops::invariant_linear(x, w, bias, residual);
      dflash::kernel_ops::set_invariant_linear_warpgroups(4);
      const at::Tensor four = dflash::kernel_ops::invariant_linear(x, w, bias, residual);
      dflash::kernel_ops::set_invariant_linear_warpgroups(2);
      EXPECT_TRUE(at::equal(two, four)) << "out " << s.out << ", in " << s.in << ", " << rows << " rows";
    }
  }
  EXPECT_THROW(dflash::kernel_ops::set_invariant_linear_warpgroups(3), std::invalid_argument);
}

}  // namespace
