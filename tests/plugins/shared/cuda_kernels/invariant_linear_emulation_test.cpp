// invariant_linear's own source (invariant_linear.cu, rewritten for the CPU by
// emulate_kernel_source.py, run by tests/support/cuda_emulation/) on every
// machine: the products within bf16 rounding of exact sums, and each row
// bitwise the same alone as among 17 to 150 rows — the kernel's indexing,
// its runs of k through the workspace, bias and residual, checked where CI
// has no GPU. invariant_linear_test.cpp checks the same on the device.
#include "invariant_linear_emulated.cpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace {

namespace ck = dflash::cuda_kernels;
using Bf16 = __nv_bfloat16;

struct Problem {
  int64_t out, in;
  std::vector<Bf16> x, weight, bias, residual;  // x and residual: `most` rows
};

Problem make_problem(int64_t out, int64_t in, int64_t most, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](int64_t n, float scale) {
    std::vector<Bf16> v(static_cast<size_t>(n));
    for (Bf16& e : v) e = __float2bfloat16(normal(rng) * scale);
    return v;
  };
  return {out, in, fill(most * in, 1.f), fill(out * in, 0.05f), fill(out, 1.f), fill(most * out, 1.f)};
}

// Rows [first, first + rows) of the problem through the kernel; with_bias
// picks the bias; the residual is added in place (out = residual), as
// invariant_add_linear_ does.
// kWgmma: each stage's products waited for; kWgmmaInFlight: a stage's
// products kept running past the next stage's issue (the default).
enum class Kernel { kMmaSync, kWgmma, kWgmmaInFlight };

// splits: the runs of k of the wgmma kernels, the library's count where 0
// (one run makes a run long enough for their ring of stages to wrap).
std::vector<Bf16> run(const Problem& p, int64_t first, int64_t rows, bool with_bias, Kernel kernel = Kernel::kMmaSync,
                      int64_t splits = 0) {
  std::vector<Bf16> x(p.x.begin() + first * p.in, p.x.begin() + (first + rows) * p.in);
  std::vector<Bf16> out(p.residual.begin() + first * p.out, p.residual.begin() + (first + rows) * p.out);
  const int64_t floats = std::max(ck::invariant_linear_workspace_floats(rows, p.out, p.in), splits * rows * p.out);
  std::vector<float> workspace(static_cast<size_t>(std::max<int64_t>(1, floats)), std::nanf(""));
  if (kernel == Kernel::kMmaSync) {
    ck::invariant_linear(ck::Element::kBFloat16, x.data(), p.weight.data(), with_bias ? p.bias.data() : nullptr,
                         out.data(), out.data(), workspace.data(), rows, p.out, p.in, nullptr);
  } else {
    const ck::LinearCall c = ck::linear_call(x.data(), p.weight.data(), with_bias ? p.bias.data() : nullptr, out.data(),
                                             out.data(), workspace.data(), rows, p.out, p.in,
                                             splits > 0 ? splits : ck::invariant_linear_splits(p.out, p.in));
    const bool added = kernel == Kernel::kWgmma ? ck::launch_products_wgmma<Bf16, 4, 0>(c, nullptr)
                                                : ck::launch_products_wgmma<Bf16>(c, nullptr);
    if (!added) ck::launch_add_runs<Bf16>(c, nullptr);
  }
  return out;
}

double exact(const Problem& p, int64_t row, int64_t j, bool with_bias) {
  double sum = 0;
  for (int64_t k = 0; k < p.in; ++k)
    sum += static_cast<double>(__bfloat162float(p.x[row * p.in + k])) * __bfloat162float(p.weight[j * p.in + k]);
  return sum + (with_bias ? __bfloat162float(p.bias[j]) : 0.f) + __bfloat162float(p.residual[row * p.out + j]);
}

// The largest error of out's first `rows` rows against the exact sums,
// relative to each sum's size (+0.05, so sums near zero are judged by 0.05).
double worst_error(const Problem& p, const std::vector<Bf16>& out, int64_t rows, bool with_bias) {
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < p.out; ++j) {
      const double want = exact(p, r, j, with_bias);
      worst = std::max(worst, std::abs(__bfloat162float(out[r * p.out + j]) - want) / (std::abs(want) + 0.05));
    }
  return worst;
}

// How many of `count` outputs differ in their bits, a[i] against b[i].
int differing_bits(const Bf16* a, const Bf16* b, size_t count) {
  int differing = 0;
  for (size_t i = 0; i < count; ++i) differing += a[i].bits != b[i].bits;
  return differing;
}

TEST(InvariantLinearEmulated, ARowGetsTheSameBitsAloneAsAmongOtherRowsAndTheProductIsRight) {
  struct Shape {
    int64_t out, in;
  };
  // 300 × 520: two runs of k, the last chunk partial, a partial block of
  // features; 136 × 1032: four runs; 1100 × 64: one run (no workspace);
  // 24 × 8: a single partial chunk.
  const std::vector<Shape> shapes = {{300, 520}, {136, 1032}, {1100, 64}, {24, 8}};
  EXPECT_GT(ck::invariant_linear_splits(300, 520), 1);
  EXPECT_GT(ck::invariant_linear_splits(136, 1032), ck::invariant_linear_splits(300, 520));
  EXPECT_EQ(ck::invariant_linear_splits(1100, 64), 1);
  const int64_t most = 150;
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    const Problem p = make_problem(s.out, s.in, most, seed++);
    // 17 rows: two tiles; 129: nine tiles in one block (a 128-node tree and
    // its newest token); 150: ten tiles, blocks of eight.
    for (const int64_t rows : {int64_t{17}, int64_t{129}, int64_t{150}}) {
      const bool with_bias = rows % 2 == 1;
      SCOPED_TRACE("out " + std::to_string(s.out) + ", in " + std::to_string(s.in) + ", rows " + std::to_string(rows));
      const std::vector<Bf16> all = run(p, 0, rows, with_bias);
      EXPECT_LT(worst_error(p, all, rows, with_bias), 1e-2);  // one bf16 rounding is 2^-9 relative
      for (const int64_t r : {int64_t{0}, rows / 2 + 3, rows - 1}) {
        const std::vector<Bf16> alone = run(p, r, 1, with_bias);
        EXPECT_EQ(differing_bits(alone.data(), all.data() + r * s.out, static_cast<size_t>(s.out)), 0) << "row " << r << " alone";
      }
    }
  }
}

// The warpgroup-MMA products (wgmma.cuh, emulated from the PTX ISA's
// layouts): the descriptors, the swizzled copy, the ring of stages (one
// run of k: 9 stages through 4 and 6 buffers) and the accumulators' fragment
// layout, checked the same way. 33 rows: N = 40; 150: blocks of 144 rows and
// of 8; a row alone: N = 8. (The emulated products run at once, so a buffer
// refilled while the device still reads it cannot show here; the probe on
// the GPU checks that.)
TEST(InvariantLinearEmulated, TheWarpgroupKernelsRowsGetTheSameBitsAloneAndTheProductIsRight) {
  struct Case {
    int64_t out, in, rows;
  };
  // Two runs of k through the workspace at 150 rows; one run at 33.
  const std::vector<Case> cases = {{300, 520, 150}, {1100, 64, 33}};
  uint32_t seed = 11;
  for (const Case& s : cases) {
    const Problem p = make_problem(s.out, s.in, s.rows, seed++);
    const int64_t rows = s.rows;
    for (const Kernel kernel : {Kernel::kWgmma, Kernel::kWgmmaInFlight})
    for (const int64_t splits : {int64_t{0}, int64_t{1}}) {
      const bool with_bias = rows % 2 == 1;
      SCOPED_TRACE("out " + std::to_string(s.out) + ", in " + std::to_string(s.in) + ", rows " + std::to_string(rows) +
                   (kernel == Kernel::kWgmma ? "" : ", products in flight") + (splits == 1 ? ", one run" : ""));
      const std::vector<Bf16> all = run(p, 0, rows, with_bias, kernel, splits);
      EXPECT_LT(worst_error(p, all, rows, with_bias), 1e-2);
      for (const int64_t r : {int64_t{0}, rows / 2 + 3, rows - 1}) {
        const std::vector<Bf16> alone = run(p, r, 1, with_bias, kernel, splits);
        EXPECT_EQ(differing_bits(alone.data(), all.data() + r * s.out, static_cast<size_t>(s.out)), 0) << "row " << r << " alone";
      }
    }
  }
}

// The runs of k added in a cluster of their blocks' shared memory
// (sum_runs_in_cluster: each block's sums, the cluster's barrier, each
// block's share of the adding from every block's memory) against the
// workspace and its second kernel: bitwise the same outputs, with bias and
// residual, for 3 runs and for 9 (a cluster past the portable 8), at 150
// rows (a block of 144 and one of 8) and at one row. The weights make the
// order of the adding show through bf16: run 0 sums to +B, run 1 to −B, the
// others to small values s, so run order gives (B − B) + s = s, while any
// other order rounds s to B's ulp (adding in reverse fails this test).
TEST(InvariantLinearEmulated, ARunsSumsAddedInAClusterGiveTheWorkspacesBits) {
  const int64_t out = 136, in = 1032, most = 150;
  Problem p = make_problem(out, in, most, 21);
  std::fill(p.x.begin(), p.x.end(), __float2bfloat16(1.f));
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.f, 0.02f);
  for (const int64_t splits : {int64_t{3}, int64_t{9}}) {
    const int64_t run_k = 32 * (((in + 31) / 32 + splits - 1) / splits);  // k a run (linear_call's per_split chunks)
    for (int64_t j = 0; j < out; ++j)
      for (int64_t k = 0; k < in; ++k)
        p.weight[j * in + k] = __float2bfloat16(k < run_k ? 1024.f : k < 2 * run_k ? -1024.f : normal(rng));
    for (const int64_t rows : {int64_t{150}, int64_t{1}}) {
      SCOPED_TRACE(std::to_string(splits) + " runs, " + std::to_string(rows) + " rows");
      ck::set_invariant_linear_most_cluster_runs(16);
      const std::vector<Bf16> clustered = run(p, 0, rows, /*with_bias=*/true, Kernel::kWgmmaInFlight, splits);
      ck::set_invariant_linear_most_cluster_runs(1);  // the default
      const std::vector<Bf16> through_workspace = run(p, 0, rows, /*with_bias=*/true, Kernel::kWgmmaInFlight, splits);
      ASSERT_EQ(clustered.size(), through_workspace.size());
      EXPECT_EQ(differing_bits(clustered.data(), through_workspace.data(), clustered.size()), 0);
      EXPECT_LT(worst_error(p, clustered, rows, true), 1e-2);
    }
  }
}

// Blocks of four warpgroups (256 features, set_invariant_linear_warpgroups)
// against the default two: bitwise the same outputs at one row, at 33 (N =
// 40) and at 65 (N = 72, a 64-node tree), with a partial block of features
// (300 of 512) and two runs of k through the workspace; 150 rows (N = 144)
// keep two warpgroups. The product within bf16 rounding of the exact sum.
TEST(InvariantLinearEmulated, BlocksOfFourWarpgroupsGiveTheTwosBits) {
  const Problem p = make_problem(300, 520, 150, 31);
  for (const int64_t rows : {int64_t{1}, int64_t{33}, int64_t{65}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const std::vector<Bf16> two = run(p, 0, rows, /*with_bias=*/true, Kernel::kWgmmaInFlight);
    ck::set_invariant_linear_warpgroups(4);
    const std::vector<Bf16> four = run(p, 0, rows, /*with_bias=*/true, Kernel::kWgmmaInFlight);
    ck::set_invariant_linear_warpgroups(2);  // the default
    ASSERT_EQ(two.size(), four.size());
    EXPECT_EQ(differing_bits(two.data(), four.data(), two.size()), 0);
    EXPECT_LT(worst_error(p, four, rows, true), 1e-2);
  }
  EXPECT_THROW(ck::set_invariant_linear_warpgroups(3), std::invalid_argument);
}

}  // namespace
