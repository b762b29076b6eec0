// trainable_ops (plugins/shared/cuda_kernels): the drafter's fused layer
// pieces against Hugging Face's op-by-op arithmetic through autograd, forward
// and backward (every input's gradient, weights included). On the CPU the
// closed forms (fp64 to rounding noise, fp32); on a GPU the CUDA kernels
// (bf16, fp16, widths that take the vectorised and the scalar kernels)
// against the same chain and against the closed forms.
//
// GPU tolerances: both paths round to bf16 at the same points in the
// forward, but sum in other orders (block/warp trees against ATen's
// reductions; the MLP block adds the residual inside its GEMM, one rounding
// instead of two), and the chain's backward rounds every intermediate
// gradient to bf16 where the kernels keep fp32 until the end. Single elements
// therefore differ by a few bf16 ulps (2^-8 relative each); 3e-2 of the
// largest magnitude bounds that, while a wrong formula or a wrong index
// (a swapped half of the rotation, a transposed gradient) differs by O(1).
#include <trainable_ops.h>

#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace {
namespace tops = dflash::trainable_ops;
using Inputs = std::vector<torch::Tensor>;
using Op = std::function<torch::Tensor(const Inputs&)>;

// ---- Hugging Face's arithmetic, op by op (the reference) --------------------
torch::Tensor chain_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const auto f = x.to(x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat);
  return w * (f * torch::rsqrt(f.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}
torch::Tensor chain_rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}
torch::Tensor chain_head_norm_rope(const torch::Tensor& x, const torch::Tensor& w, const tops::RotaryHalves& r, double eps) {
  const auto full = [&](const torch::Tensor& h) { return torch::cat({h, h}, -1).unsqueeze(-2).to(x.scalar_type()); };
  const auto n = chain_rms_norm(x, w, eps);
  return n * full(r.cos) + chain_rotate_half(n) * full(r.sin);
}
torch::Tensor chain_mlp_block(const torch::Tensor& y, const torch::Tensor& norm_w, const torch::Tensor& gate,
                              const torch::Tensor& up, const torch::Tensor& down, double eps) {
  const auto m = chain_rms_norm(y, norm_w, eps);
  return y + torch::linear(torch::silu(torch::linear(m, gate)) * torch::linear(m, up), down);
}

// ---- Running an op and comparing ---------------------------------------------
struct Run {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // one per input
};
Run run(const Op& op, const Inputs& inputs, const torch::Tensor& grad_out) {
  Inputs leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  const torch::Tensor out = op(leaves);
  return {out.detach(), torch::autograd::grad({out}, leaves, {grad_out})};
}
// max |a − b| / max |b|.
double relative(const torch::Tensor& a, const torch::Tensor& b) {
  const auto fa = a.to(torch::kDouble).cpu(), fb = b.to(torch::kDouble).cpu();
  const double scale = fb.abs().max().item<double>();
  return (fa - fb).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}
void expect_close(const Run& got, const Run& want, double tolerance, const std::string& what) {
  EXPECT_LE(relative(got.out, want.out), tolerance) << what << ": output";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i)
    EXPECT_LE(relative(got.grads[i], want.grads[i]), tolerance) << what << ": gradient of input " << i;
}

constexpr double kEps = 1e-6;

// One case of each op: its fused form (on a given path), its chain, its inputs.
struct Case {
  std::string name;
  std::function<torch::Tensor(const Inputs&, tops::Path)> fused;
  Op chain;
  Inputs inputs;
};

std::vector<Case> cases(const torch::TensorOptions& o, int64_t width, int64_t head_dim) {
  const auto norm_weight = [&](int64_t n) { return (1 + 0.2 * torch::randn({n}, o.dtype(torch::kFloat))).to(o.dtype()); };
  const auto positions = torch::randint(0, 4000, {2, 9}, torch::kLong);
  const tops::RotaryHalves rotary =
      tops::rotary_halves(positions, head_dim, 1e6, o.device(), tops::rotary_dtype(c10::typeMetaToScalarType(o.dtype())));
  const int64_t inter = 2 * width + 8;
  // Projections scaled by 1/√fan-in (activations of order one, as trained
  // layers have): a fixed scale overflowed fp16 at width 5120.
  const auto in_scale = [](int64_t fan_in) { return 1.0 / std::sqrt(static_cast<double>(fan_in)); };
  std::vector<Case> all;
  all.push_back({"rms_norm", [=](const Inputs& in, tops::Path path) { return tops::rms_norm(in[0], in[1], kEps, path); },
                 [=](const Inputs& in) { return chain_rms_norm(in[0], in[1], kEps); },
                 {3 * torch::randn({2, 9, width}, o), norm_weight(width)}});
  all.push_back({"head_norm_rope",
                 [=](const Inputs& in, tops::Path path) { return tops::head_norm_rope(in[0], in[1], rotary, kEps, path); },
                 [=](const Inputs& in) { return chain_head_norm_rope(in[0], in[1], rotary, kEps); },
                 {torch::randn({2, 9, 4, head_dim}, o), norm_weight(head_dim)}});
  // The three projections concatenated, so one output gradient reaches all of them.
  all.push_back({"norm_projections",
                 [=](const Inputs& in, tops::Path path) {
                   const tops::Projections p = tops::norm_projections(in[0], in[1], in[2], in[3], in[4], kEps, path);
                   return torch::cat({p.first, p.second, p.third}, -1);
                 },
                 [=](const Inputs& in) {
                   const auto h = chain_rms_norm(in[0], in[1], kEps);
                   return torch::cat({torch::linear(h, in[2]), torch::linear(h, in[3]), torch::linear(h, in[4])}, -1);
                 },
                 {torch::randn({2, 9, width}, o), norm_weight(width), in_scale(width) * torch::randn({width, width}, o),
                  in_scale(width) * torch::randn({width / 2, width}, o), in_scale(width) * torch::randn({width / 2, width}, o)}});
  all.push_back({"mlp_block",
                 [=](const Inputs& in, tops::Path path) {
                   return tops::mlp_block(in[0], in[1], in[2], in[3], in[4], kEps, path);
                 },
                 [=](const Inputs& in) { return chain_mlp_block(in[0], in[1], in[2], in[3], in[4], kEps); },
                 {torch::randn({2, 9, width}, o), norm_weight(width), in_scale(width) * torch::randn({inter, width}, o),
                  in_scale(width) * torch::randn({inter, width}, o), in_scale(inter) * torch::randn({width, inter}, o)}});
  return all;
}

// Every op on `path` against the chain and, when asked, against the closed
// forms, with one random output gradient each.
void compare_all(const torch::TensorOptions& o, int64_t width, int64_t head_dim, tops::Path path, double tolerance,
                 bool also_against_closed_forms = false) {
  for (const Case& c : cases(o, width, head_dim)) {
    SCOPED_TRACE(c.name + " width " + std::to_string(width) + " head_dim " + std::to_string(head_dim));
    const torch::Tensor grad_out = torch::randn(c.chain(c.inputs).sizes(), o);
    const Run fused = run([&](const Inputs& in) { return c.fused(in, path); }, c.inputs, grad_out);
    expect_close(fused, run(c.chain, c.inputs, grad_out), tolerance, c.name + " against the chain");
    if (also_against_closed_forms)
      expect_close(fused, run([&](const Inputs& in) { return c.fused(in, tops::Path::kClosedForm); }, c.inputs, grad_out),
                   tolerance, c.name + " against the closed form");
  }
}

TEST(TrainableOps, ClosedFormsMatchAutogradThroughTheChainInFp64) {
  torch::manual_seed(1);
  compare_all(torch::TensorOptions().dtype(torch::kDouble), 24, 16, tops::Path::kClosedForm, 1e-12);
  // kAuto on the CPU is the closed form too.
  compare_all(torch::TensorOptions().dtype(torch::kDouble), 20, 8, tops::Path::kAuto, 1e-12);
}

TEST(TrainableOps, ClosedFormsMatchTheChainInFp32) {
  torch::manual_seed(2);
  compare_all(torch::TensorOptions().dtype(torch::kFloat), 48, 32, tops::Path::kAuto, 1e-5);
}

// The rotation's angles: θ^(−2i/d)·position, the halves of Hugging Face's
// cat(freqs, freqs) tables.
TEST(TrainableOps, RotaryHalvesAreTheAnglesOfEveryPosition) {
  const auto positions = torch::tensor({0, 1, 7, 4095}, torch::kLong);
  const auto halves = tops::rotary_halves(positions, 8, 10000.0, torch::kCPU, torch::kDouble);
  ASSERT_EQ(halves.cos.sizes(), (std::vector<int64_t>{4, 4}));
  for (int64_t p = 0; p < 4; ++p)
    for (int64_t i = 0; i < 4; ++i) {
      const double angle = static_cast<double>(positions[p].item<int64_t>()) * std::pow(10000.0, -2.0 * i / 8.0);
      EXPECT_NEAR(halves.cos[p][i].item<double>(), std::cos(angle), 1e-12);
      EXPECT_NEAR(halves.sin[p][i].item<double>(), std::sin(angle), 1e-12);
    }
  EXPECT_EQ(tops::rotary_dtype(torch::kBFloat16), torch::kFloat);
  EXPECT_EQ(tops::rotary_dtype(torch::kDouble), torch::kDouble);
}

// On a GPU in bf16 and fp16: the CUDA kernels (vectorised widths, multiples
// of 8, and scalar ones) against the chain and against the closed forms;
// fp32 on the GPU takes the closed forms.
TEST(TrainableOps, CudaKernelsMatchTheChainForwardAndBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(3);
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
    SCOPED_TRACE(dtype == torch::kBFloat16 ? "bf16" : "fp16");
    compare_all(o, 5120, 128, tops::Path::kAuto, 3e-2, true);  // the 27B drafter's widths
    compare_all(o, 76, 64, tops::Path::kAuto, 3e-2, true);     // width 76: the scalar kernels
  }
  compare_all(torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat), 64, 32, tops::Path::kAuto, 1e-5);
}

}  // namespace
