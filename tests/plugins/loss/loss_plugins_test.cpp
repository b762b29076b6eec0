// The four loss plugins, loaded through the host from the build's plugin
// folder, against an fp64 ground truth and a same-dtype naive reference:
// pass when |impl − truth| ≤ 2·|reference − truth| + tol, for the loss and the
// gradients of the hidden states (and of the weight when it trains).
#include "loss_truth.h"
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "support/expect.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <memory>

namespace {
using namespace dflash::host;
using dflash::test::direct_loss;
using dflash::test::LossInputsT;
using dflash::test::LossSpec;
using dflash::test::TeacherSignal;

PluginRegistry& registry() {
  static PluginRegistry* instance = [] {
    auto* made = new PluginRegistry();
    made->add_directory(DFLASH_INTREE_PLUGIN_DIR);
    return made;
  }();
  return *instance;
}

std::unique_ptr<LossInstance> make_loss(const std::string& name, const nlohmann::json& config) {
  const PluginRecord& record = registry().find(DFLASH_KIND_LOSS, name);
  // Fill defaults the way the host does, from the plugin's own schema.
  nlohmann::json full = config;
  for (auto& [key, property] : record.schema.at("properties").items())
    if (!full.contains(key)) full[key] = property.at("default");
  return std::make_unique<LossInstance>(record, full, InstanceOptions{});
}

struct Case {
  std::string plugin;
  nlohmann::json config;
  LossSpec spec;
  int64_t n = 252, h = 123, v = 507, k = 16;
  int64_t teacher_h = 0;  // > 0: the teacher's own head [V, teacher_h] (a drafter's draft vocabulary, ABI 1.6)
  double ignored = 0.2;
  bool row_weights = true;
  bool trainable = false;
  double upstream = 1.0;
  torch::ScalarType dtype = torch::kFloat;
  torch::Device device = torch::kCPU;
};

// Inputs in fp64; each side casts them to its own dtype.
LossInputsT make_inputs(const Case& c, uint64_t seed) {
  torch::manual_seed(seed);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  LossInputsT in;
  in.hidden = torch::randn({c.n, c.h}, opts);
  in.weight = torch::randn({c.v, c.h}, opts) * (3.0 / std::sqrt(static_cast<double>(c.h)));
  in.targets = torch::randint(0, c.v, {c.n}, torch::kLong);
  const auto drop = torch::rand({c.n}, opts).lt(c.ignored);
  in.targets.masked_fill_(drop, -100);
  if (c.row_weights) in.row_weights = torch::rand({c.n}, opts) * 2.0;
  if (c.teacher_h > 0) {
    in.teacher_hidden = torch::randn({c.n, c.teacher_h}, opts);
    in.teacher_weight = torch::randn({c.v, c.teacher_h}, opts) * (3.0 / std::sqrt(static_cast<double>(c.teacher_h)));
  } else {
    in.teacher_hidden = in.hidden + 0.7 * torch::randn({c.n, c.h}, opts);
  }
  const auto teacher_log_p = torch::log_softmax(
      torch::matmul(in.teacher_hidden, (in.teacher_weight.defined() ? in.teacher_weight : in.weight).t()), 1);
  const auto top = teacher_log_p.topk(std::min(c.k, c.v), 1);
  in.topk_logprobs = std::get<0>(top);
  in.topk_ids = std::get<1>(top);
  return in;
}

LossInputsT cast(const LossInputsT& in, torch::ScalarType dtype, bool trainable, torch::Device device = torch::kCPU) {
  const auto float_type = dtype == torch::kDouble ? dtype : torch::kFloat;
  LossInputsT out;
  out.hidden = in.hidden.to(device, dtype).detach().requires_grad_(true);
  out.weight = in.weight.to(device, dtype).detach().requires_grad_(trainable);
  out.targets = in.targets.to(device);
  out.teacher_hidden = in.teacher_hidden.to(device, dtype);
  if (in.teacher_weight.defined()) out.teacher_weight = in.teacher_weight.to(device, dtype);
  if (in.row_weights.defined()) out.row_weights = in.row_weights.to(device, float_type);
  out.topk_ids = in.topk_ids.to(device);
  out.topk_logprobs = in.topk_logprobs.to(device, float_type);
  return out;
}

struct Result {
  torch::Tensor loss, grad_hidden, grad_weight;
  NamedTensors metrics;
};

Result run_direct(const LossInputsT& in, const LossSpec& spec, torch::ScalarType math, double upstream) {
  Result r;
  r.loss = direct_loss(in, spec, math);
  r.loss.backward(torch::full({}, upstream, r.loss.options()));
  r.grad_hidden = in.hidden.grad();
  r.grad_weight = in.weight.requires_grad() ? in.weight.grad() : torch::Tensor();
  return r;
}

Result run_plugin(LossInstance& loss, const LossInputsT& in, const LossSpec& spec, double upstream) {
  LossCall call{in.hidden, in.weight, in.targets, spec.ignore_index, in.row_weights};
  if (spec.teacher == TeacherSignal::kHidden) {
    call.teacher = DFLASH_TEACHER_HIDDEN;
    call.teacher_hidden = in.teacher_hidden;
    call.teacher_lm_head_weight = in.teacher_weight;
  } else if (spec.teacher == TeacherSignal::kTopK) {
    call.teacher = DFLASH_TEACHER_TOPK;
    call.teacher_topk_ids = in.topk_ids;
    call.teacher_topk_logprobs = in.topk_logprobs;
  }
  LossOutput out = loss.compute(call);
  Result r;
  r.loss = out.loss;
  r.metrics = out.metrics;
  out.loss.backward(torch::full({}, upstream, out.loss.options()));
  r.grad_hidden = in.hidden.grad();
  r.grad_weight = in.weight.requires_grad() ? in.weight.grad() : torch::Tensor();
  return r;
}

double error(const torch::Tensor& x, const torch::Tensor& truth) {
  return (x.to(torch::kCPU, torch::kDouble) - truth.to(torch::kCPU, torch::kDouble)).abs().max().item<double>();
}

// |impl − truth| ≤ 2·|reference − truth| + tol·scale
void expect_within(const char* what, const torch::Tensor& impl, const torch::Tensor& reference,
                   const torch::Tensor& truth, double tol) {
  ASSERT_TRUE(impl.defined()) << what << " is missing";
  ASSERT_FALSE(torch::isnan(impl).any().item<bool>()) << what << " has NaN";
  const double scale = std::max(1.0, truth.abs().max().item<double>());
  const double e_impl = error(impl, truth), e_ref = error(reference, truth);
  EXPECT_LE(e_impl, 2 * e_ref + tol * scale)
      << what << ": impl error " << e_impl << ", reference error " << e_ref << ", scale " << scale;
}

void check_case(const Case& c, uint64_t seed = 1) {
  SCOPED_TRACE(c.plugin + " " + c.config.dump());
  const LossInputsT base = make_inputs(c, seed);
  const auto math = c.dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
  const Result truth = run_direct(cast(base, torch::kDouble, c.trainable), c.spec, torch::kDouble, c.upstream);
  const Result reference = run_direct(cast(base, c.dtype, c.trainable, c.device), c.spec, math, c.upstream);
  auto loss = make_loss(c.plugin, c.config);
  const Result impl = run_plugin(*loss, cast(base, c.dtype, c.trainable, c.device), c.spec, c.upstream);
  const double tol = c.dtype == torch::kBFloat16 || c.dtype == torch::kHalf ? 2e-3 : 1e-5;
  expect_within("loss", impl.loss, reference.loss, truth.loss, tol);
  expect_within("grad hidden", impl.grad_hidden, reference.grad_hidden, truth.grad_hidden, tol);
  if (c.trainable) expect_within("grad weight", impl.grad_weight, reference.grad_weight, truth.grad_weight, tol);
}

LossSpec spec(double alpha, double temperature, TeacherSignal teacher, bool mean = true) {
  LossSpec s;
  s.alpha = alpha;
  s.temperature = temperature;
  s.teacher = teacher;
  s.mean = mean;
  return s;
}

// --- ce ----------------------------------------------------------------------
TEST(CeLoss, MeanSumWeightsUpstreamAndTrainableWeight) {
  check_case({"ce", {{"reduction", "mean"}}, spec(0, 1, TeacherSignal::kNone)});
  check_case({"ce", {{"reduction", "sum"}}, spec(0, 1, TeacherSignal::kNone, false)});
  Case unweighted{"ce", {{"reduction", "mean"}}, spec(0, 1, TeacherSignal::kNone)};
  unweighted.row_weights = false;
  unweighted.upstream = 2.5;
  unweighted.trainable = true;
  check_case(unweighted);
}

// --- kl ----------------------------------------------------------------------
TEST(KlLoss, KlOnlyBlendTemperatureCeOnly) {
  check_case({"kl", {{"kl_weight", 1.0}}, spec(1, 1, TeacherSignal::kHidden)});
  Case blend{"kl", {{"kl_weight", 0.3}, {"temperature", 2.0}}, spec(0.3, 2, TeacherSignal::kHidden)};
  blend.upstream = -1.5;
  blend.trainable = true;
  check_case(blend);
  check_case({"kl", {{"kl_weight", 0.0}, {"reduction", "sum"}}, spec(0, 1, TeacherSignal::kNone, false)});
}

// A drafter's own head over a draft vocabulary (ABI 1.6): the student's
// logits through its trainable head, the teacher's through the target's head
// restricted to the same tokens, of another hidden size.
TEST(KlLosses, TheTeacherThroughAHeadOfItsOwn) {
  for (const char* plugin : {"kl", "fused_ckpt_kl"}) {
    for (int64_t chunk : {0, 37}) {
      Case c{plugin, {{"kl_weight", 0.6}, {"temperature", 1.5}, {"chunk_size", chunk}}, spec(0.6, 1.5, TeacherSignal::kHidden)};
      c.teacher_h = 97;
      c.trainable = true;
      c.upstream = 1.25;
      check_case(c);
    }
  }
  Case bf16{"fused_ckpt_kl", {{"kl_weight", 1.0}, {"chunk_size", 50}}, spec(1, 1, TeacherSignal::kHidden)};
  bf16.teacher_h = 64;
  bf16.dtype = torch::kBFloat16;
  check_case(bf16);
}

// The teacher's own head must cover the student's V tokens, at teacher_hidden's H.
TEST(KlLosses, AMisfitTeacherHeadIsRefusedByName) {
  Case c{"kl", {{"kl_weight", 0.5}}, spec(0.5, 1, TeacherSignal::kHidden)};
  c.teacher_h = 40;
  const LossInputsT good = cast(make_inputs(c, 3), torch::kFloat, false);
  auto loss = make_loss("kl", c.config);
  auto expect_error = [&](const torch::Tensor& teacher_hidden, const torch::Tensor& teacher_weight, const std::string& fragment) {
    LossCall call{good.hidden, good.weight, good.targets, -100, good.row_weights};
    call.teacher = DFLASH_TEACHER_HIDDEN;
    call.teacher_hidden = teacher_hidden;
    call.teacher_lm_head_weight = teacher_weight;
    try {
      loss->compute(call);
      ADD_FAILURE() << "accepted, expected: " << fragment;
    } catch (const PluginCallError& e) {
      EXPECT_EQ(e.code(), DFLASH_ERR_INVALID_ARGUMENT);
      EXPECT_CONTAINS(e.what(), fragment);
    }
  };
  expect_error(good.teacher_hidden, good.teacher_weight.narrow(0, 0, c.v - 1),
               "teacher_lm_head_weight must be [V, H_t] with the V = 507");
  expect_error(good.teacher_hidden.narrow(1, 0, 39), good.teacher_weight, "teacher_hidden must be [N, H_t] = [252, 40]");
  expect_error(good.teacher_hidden, good.teacher_weight.to(torch::kDouble), "teacher_lm_head_weight is Double");
}

// A loss library built before ABI 1.6 never reads the teacher's own head: the
// host refuses to hand it one rather than let it score the teacher through
// the student's head.
TEST(KlLosses, ALibraryBeforeAbi16IsNeverHandedATeacherHead) {
  PluginRecord old = registry().find(DFLASH_KIND_LOSS, "kl");
  old.abi_minor = 5;
  nlohmann::json config = {{"kl_weight", 0.5}};
  for (auto& [key, property] : old.schema.at("properties").items())
    if (!config.contains(key)) config[key] = property.at("default");
  LossInstance loss(old, config, InstanceOptions{});
  EXPECT_FALSE(loss.reads_teacher_head());
  Case c{"kl", config, spec(0.5, 1, TeacherSignal::kHidden)};
  c.teacher_h = 40;
  const LossInputsT in = cast(make_inputs(c, 4), torch::kFloat, false);
  LossCall call{in.hidden, in.weight, in.targets, -100, in.row_weights};
  call.teacher = DFLASH_TEACHER_HIDDEN;
  call.teacher_hidden = in.teacher_hidden;
  call.teacher_lm_head_weight = in.teacher_weight;
  try {
    loss.compute(call);
    ADD_FAILURE() << "a 1.5 loss was handed a teacher head";
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "built against plugin ABI 1.5");
    EXPECT_CONTAINS(e.what(), "score the teacher through the drafter's head");
  }
  EXPECT_TRUE(make_loss("kl", config)->reads_teacher_head());
}

// --- topk_kl -----------------------------------------------------------------
TEST(TopKKlLoss, KEqualsOneSixteenAndV) {
  for (int64_t k : {1, 16, 507}) {
    Case c{"topk_kl", {{"kl_weight", 1.0}}, spec(1, 1, TeacherSignal::kTopK)};
    c.k = k;
    check_case(c);
  }
  Case tempered{"topk_kl", {{"kl_weight", 0.5}, {"temperature", 2.0}}, spec(0.5, 2, TeacherSignal::kTopK)};
  tempered.trainable = true;
  tempered.upstream = 3.0;
  check_case(tempered);
}

TEST(TopKKlLoss, AtKEqualsVItIsTheFullKl) {
  Case c{"topk_kl", {}, spec(1, 1, TeacherSignal::kTopK)};
  c.k = c.v;
  const LossInputsT base = make_inputs(c, 3);
  auto topk = make_loss("topk_kl", {{"kl_weight", 1.0}});
  auto full = make_loss("kl", {{"kl_weight", 1.0}});
  const Result a = run_plugin(*topk, cast(base, torch::kDouble, false), spec(1, 1, TeacherSignal::kTopK), 1.0);
  const Result b = run_plugin(*full, cast(base, torch::kDouble, false), spec(1, 1, TeacherSignal::kHidden), 1.0);
  EXPECT_NEAR(a.loss.item<double>(), b.loss.item<double>(), 1e-9);
  EXPECT_LT(error(a.grad_hidden, b.grad_hidden), 1e-9);
}

TEST(TopKKlLoss, UsesOnlyTheConfiguredColumns) {
  Case c{"topk_kl", {}, spec(1, 1, TeacherSignal::kTopK)};
  c.k = 32;
  const LossInputsT base = make_inputs(c, 4);
  LossInputsT first8 = base;
  first8.topk_ids = base.topk_ids.narrow(1, 0, 8).contiguous();
  first8.topk_logprobs = base.topk_logprobs.narrow(1, 0, 8).contiguous();
  auto narrowed = make_loss("topk_kl", {{"kl_weight", 1.0}, {"topk", 8}});
  auto plain = make_loss("topk_kl", {{"kl_weight", 1.0}});
  const double a = run_plugin(*narrowed, cast(base, torch::kDouble, false), c.spec, 1).loss.item<double>();
  const double b = run_plugin(*plain, cast(first8, torch::kDouble, false), c.spec, 1).loss.item<double>();
  EXPECT_NEAR(a, b, 1e-12);
}

// --- fused_ckpt_kl -------------------------------------------------------------
TEST(FusedCkptKlLoss, ChunkSizesOneNonDivisorLargerThanNAndAutomatic) {
  for (int64_t chunk : {1, 100, 1000, 0}) {
    Case c{"fused_ckpt_kl", {{"kl_weight", 0.3}, {"temperature", 2.0}, {"chunk_size", chunk}},
           spec(0.3, 2, TeacherSignal::kHidden)};
    c.upstream = 2.5;
    check_case(c);
  }
}

TEST(FusedCkptKlLoss, CeOnlyKlOnlyTrainableSumAndBf16) {
  check_case({"fused_ckpt_kl", {{"kl_weight", 0.0}, {"chunk_size", 64}}, spec(0, 1, TeacherSignal::kNone)});
  check_case({"fused_ckpt_kl", {{"kl_weight", 1.0}, {"chunk_size", 64}}, spec(1, 1, TeacherSignal::kHidden)});
  Case trainable{"fused_ckpt_kl", {{"kl_weight", 0.5}, {"chunk_size", 37}, {"reduction", "sum"}},
                 spec(0.5, 1, TeacherSignal::kHidden, false)};
  trainable.trainable = true;
  trainable.upstream = -0.75;
  check_case(trainable);
  Case bf16{"fused_ckpt_kl", {{"kl_weight", 0.5}, {"chunk_size", 50}}, spec(0.5, 1, TeacherSignal::kHidden)};
  bf16.dtype = torch::kBFloat16;
  check_case(bf16);
}

// On the GPU machine: the CUDA kernels of fused_ckpt_kl (scalar path at
// V = 507, vectorised at V = 512) against the same fp64 truth, 20 % of the
// rows ignored (rows neither pass reads).
TEST(FusedCkptKlLoss, CudaKernelsMatchTheTruth) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t vocab : {507, 512}) {
      for (double alpha : {0.0, 1.0, 0.3}) {
        for (int64_t chunk : {1, 100, 0}) {
          const double temperature = alpha == 0.3 ? 2.0 : 1.0;
          Case c{"fused_ckpt_kl",
                 {{"kl_weight", alpha}, {"temperature", temperature}, {"chunk_size", chunk}},
                 spec(alpha, temperature, alpha > 0 ? TeacherSignal::kHidden : TeacherSignal::kNone)};
          c.v = vocab;
          c.dtype = dtype;
          c.device = torch::Device(torch::kCUDA, 0);
          c.upstream = 1.5;
          c.trainable = chunk == 100;
          check_case(c);
        }
      }
    }
  }
}

// On the GPU machine: the first pass reports top-1 hits with ties going to
// the lower token, as torch's argmax does, and the CE of a tied row.
// Token 300's lm_head row is token 5's, both far ahead of the rest, so every
// row's best logit is a bitwise tie; targets alternate between the two.
TEST(FusedCkptKlLoss, FirstPassBreaksTiesToTheLowerTokenOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (int64_t vocab : {507, 512}) {
      SCOPED_TRACE("V " + std::to_string(vocab) + " " + c10::toString(dtype));
      Case c{"fused_ckpt_kl", {}, spec(0, 1, TeacherSignal::kNone)};
      c.v = vocab;
      LossInputsT base = make_inputs(c, 3);
      base.hidden.select(1, 0).abs_().add_(1.0);
      base.weight.select(0, 5).select(0, 0).fill_(50.0);
      base.weight.select(0, 300).copy_(base.weight.select(0, 5));
      base.targets = torch::where(torch::arange(c.n).remainder(2).eq(0), torch::full({c.n}, 5, torch::kLong),
                                  torch::full({c.n}, 300, torch::kLong));
      const LossInputsT in = cast(base, dtype, false, torch::Device(torch::kCUDA, 0));
      auto loss = make_loss("fused_ckpt_kl", {{"kl_weight", 0.0}, {"chunk_size", 64}});
      const Result r = run_plugin(*loss, in, c.spec, 1.0);
      torch::Tensor accuracy, row_ce;
      for (const auto& [key, tensor] : r.metrics) {
        if (key == "accuracy") accuracy = tensor.to(torch::kCPU, torch::kDouble);
        if (key == "ce") row_ce = tensor.to(torch::kCPU, torch::kDouble);
      }
      ASSERT_TRUE(accuracy.defined() && row_ce.defined());
      EXPECT_TRUE(torch::equal(accuracy, base.targets.eq(5).to(torch::kDouble)));
      // The truth from the same (cast) inputs in fp64: the two tied logits
      // round alike in any dtype, so a row's CE is log(2 + Σ of the rest).
      const auto logits = torch::matmul(in.hidden.detach().to(torch::kCPU, torch::kDouble),
                                        in.weight.detach().to(torch::kCPU, torch::kDouble).t());
      const auto truth = torch::logsumexp(logits, 1) - logits.gather(1, base.targets.unsqueeze(1)).squeeze(1);
      EXPECT_LT(error(row_ce, truth), 1e-4);  // lse near 100: fp32 rounding there is ~1e-5
    }
  }
}

// On the GPU machine: the closed forms of ce, kl and topk_kl (LibTorch
// operators on CUDA) against the same fp64 truth.
TEST(AllLosses, ClosedFormsMatchTheTruthOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    std::vector<Case> cases = {{"ce", {{"chunk_size", 100}}, spec(0, 1, TeacherSignal::kNone)},
                               {"kl", {{"kl_weight", 0.3}, {"temperature", 2.0}, {"chunk_size", 0}},
                                spec(0.3, 2, TeacherSignal::kHidden)},
                               {"topk_kl", {{"kl_weight", 0.5}, {"temperature", 1.5}, {"chunk_size", 64}},
                                spec(0.5, 1.5, TeacherSignal::kTopK)}};
    for (Case& c : cases) {
      c.dtype = dtype;
      c.device = torch::Device(torch::kCUDA, 0);
      c.trainable = true;
      c.upstream = 1.5;
      check_case(c);
    }
  }
}

TEST(FusedCkptKlLoss, EqualsTheKlPluginsBlend) {
  for (double alpha : {0.0, 0.4, 1.0}) {
    Case c{"fused_ckpt_kl", {}, spec(alpha, 1.5, alpha > 0 ? TeacherSignal::kHidden : TeacherSignal::kNone)};
    const LossInputsT base = make_inputs(c, 5);
    auto fused = make_loss("fused_ckpt_kl", {{"kl_weight", alpha}, {"temperature", 1.5}, {"chunk_size", 29}});
    auto plain = make_loss("kl", {{"kl_weight", alpha}, {"temperature", 1.5}});
    const Result a = run_plugin(*fused, cast(base, torch::kDouble, true), c.spec, 1.0);
    const Result b = run_plugin(*plain, cast(base, torch::kDouble, true), c.spec, 1.0);
    EXPECT_NEAR(a.loss.item<double>(), b.loss.item<double>(), 1e-10) << "alpha " << alpha;
    EXPECT_LT(error(a.grad_hidden, b.grad_hidden), 1e-10) << "alpha " << alpha;
    EXPECT_LT(error(a.grad_weight, b.grad_weight), 1e-10) << "alpha " << alpha;
  }
}

TEST(FusedCkptKlLoss, NoGradientWantedMeansLossOnly) {
  Case c{"fused_ckpt_kl", {}, spec(0.5, 1, TeacherSignal::kHidden)};
  const LossInputsT base = make_inputs(c, 6);
  auto fused = make_loss("fused_ckpt_kl", {{"kl_weight", 0.5}, {"chunk_size", 40}});
  const torch::NoGradGuard no_grad;
  LossInputsT in = cast(base, torch::kDouble, false);
  in.hidden = in.hidden.detach();
  LossOutput out = fused->compute({in.hidden, in.weight, in.targets, -100, in.row_weights, DFLASH_TEACHER_HIDDEN,
                                   in.teacher_hidden});
  EXPECT_NEAR(out.loss.item<double>(), direct_loss(in, c.spec, torch::kDouble).item<double>(), 1e-10);
  EXPECT_FALSE(out.loss.requires_grad());
}

// --- every plugin -------------------------------------------------------------
struct PluginUnderTest {
  const char* name;
  nlohmann::json config;
  TeacherSignal teacher;
};
const PluginUnderTest kAll[] = {{"ce", {}, TeacherSignal::kNone},
                                {"kl", {{"kl_weight", 0.5}}, TeacherSignal::kHidden},
                                {"topk_kl", {{"kl_weight", 0.5}}, TeacherSignal::kTopK},
                                {"fused_ckpt_kl", {{"kl_weight", 0.5}, {"chunk_size", 32}}, TeacherSignal::kHidden}};

TEST(AllLosses, AllRowsIgnoredGiveZeroLossAndZeroGradientNotNaN) {
  for (const auto& p : kAll) {
    for (const char* reduction : {"mean", "sum"}) {
      Case c{p.name, p.config, spec(p.teacher == TeacherSignal::kNone ? 0 : 0.5, 1, p.teacher)};
      c.ignored = 1.1;  // every row
      nlohmann::json config = p.config;
      config["reduction"] = reduction;
      auto loss = make_loss(p.name, config);
      const Result r = run_plugin(*loss, cast(make_inputs(c, 7), torch::kFloat, true), c.spec, 1.0);
      EXPECT_EQ(r.loss.item<double>(), 0.0) << p.name << " " << reduction;
      EXPECT_EQ(r.grad_hidden.abs().max().item<double>(), 0.0) << p.name;
      EXPECT_EQ(r.grad_weight.abs().max().item<double>(), 0.0) << p.name;
    }
  }
}

TEST(AllLosses, PerRowMetricsForSlotAggregation) {
  for (const auto& p : kAll) {
    Case c{p.name, p.config, spec(p.teacher == TeacherSignal::kNone ? 0 : 0.5, 1, p.teacher)};
    const LossInputsT base = make_inputs(c, 8);
    auto loss = make_loss(p.name, p.config);
    const Result r = run_plugin(*loss, cast(base, torch::kDouble, false), c.spec, 1.0);
    auto metric = [&](const std::string& name) {
      for (const auto& [key, tensor] : r.metrics)
        if (key == name) return tensor;
      ADD_FAILURE() << p.name << " lacks metric " << name;
      return torch::Tensor();
    };
    const auto valid = base.targets.ne(-100);
    const auto logits = torch::matmul(base.hidden, base.weight.t());
    const auto safe = torch::where(valid, base.targets, torch::zeros_like(base.targets));
    const auto ce = (-torch::log_softmax(logits, 1).gather(1, safe.unsqueeze(1)).squeeze(1)) * valid;
    EXPECT_LT(error(metric("ce"), ce), 1e-10) << p.name;
    const auto accuracy = (logits.argmax(1).eq(base.targets) & valid).to(torch::kDouble);
    EXPECT_LT(error(metric("accuracy"), accuracy), 1e-12) << p.name;
    EXPECT_GE(metric("chunk_rows").item<double>(), 1.0) << p.name;
    if (p.teacher != TeacherSignal::kNone) EXPECT_EQ(metric("kl").size(0), c.n) << p.name;
  }
}

TEST(AllLosses, BadInputsGetClearErrors) {
  for (const auto& p : kAll) {
    SCOPED_TRACE(p.name);
    Case c{p.name, p.config, spec(p.teacher == TeacherSignal::kNone ? 0 : 0.5, 1, p.teacher)};
    const LossInputsT good = cast(make_inputs(c, 9), torch::kFloat, false);
    auto loss = make_loss(p.name, p.config);
    auto call_of = [&](const LossInputsT& in) {
      LossCall call{in.hidden, in.weight, in.targets, -100, in.row_weights};
      if (p.teacher == TeacherSignal::kHidden) {
        call.teacher = DFLASH_TEACHER_HIDDEN;
        call.teacher_hidden = in.teacher_hidden;
      } else if (p.teacher == TeacherSignal::kTopK) {
        call.teacher = DFLASH_TEACHER_TOPK;
        call.teacher_topk_ids = in.topk_ids;
        call.teacher_topk_logprobs = in.topk_logprobs;
      }
      return call;
    };
    auto expect_error = [&](const LossInputsT& in, const std::string& fragment) {
      try {
        loss->compute(call_of(in));
        ADD_FAILURE() << "accepted bad input, expected: " << fragment;
      } catch (const PluginCallError& e) {
        EXPECT_EQ(e.code(), DFLASH_ERR_INVALID_ARGUMENT);
        EXPECT_CONTAINS(e.what(), fragment);
        EXPECT_CONTAINS(e.what(), std::string("loss plugin '") + p.name + "'");
      }
    };
    LossInputsT bad = good;
    bad.weight = torch::randn({c.v, c.h + 1});
    expect_error(bad, "their H must agree");
    bad = good;
    bad.weight = good.weight.to(torch::kDouble);
    expect_error(bad, "both must have one dtype");
    bad = good;
    bad.targets = good.targets.clone();
    bad.targets[3] = c.v;
    expect_error(bad, "targets[3] = 507 is outside the vocabulary [0, 507)");
    bad = good;
    bad.targets = good.targets.narrow(0, 0, c.n - 1);
    expect_error(bad, "targets must be [N] = [252]");
    bad = good;
    bad.row_weights = good.row_weights.clone();
    bad.row_weights[5] = std::numeric_limits<float>::quiet_NaN();
    expect_error(bad, "row_weights contains NaN or Inf (first at row 5)");
    if (p.teacher == TeacherSignal::kHidden) {
      bad = good;
      bad.teacher_hidden = good.teacher_hidden.clone();
      bad.teacher_hidden[7][2] = std::numeric_limits<float>::quiet_NaN();
      expect_error(bad, "teacher_hidden contains NaN or Inf (first at row 7)");
    }
    if (p.teacher == TeacherSignal::kTopK) {
      bad = good;
      bad.topk_logprobs = good.topk_logprobs.clone();
      bad.topk_logprobs[7][0] = std::numeric_limits<float>::quiet_NaN();
      expect_error(bad, "teacher_topk_logprobs contains NaN or Inf (first at row 7)");
      bad = good;
      bad.topk_ids = good.topk_ids.clone();
      bad.topk_ids[2][1] = bad.topk_ids[2][0].item<int64_t>();
      expect_error(bad, "repeats an id");
    }
    if (p.teacher != TeacherSignal::kNone) {
      LossCall no_teacher{good.hidden, good.weight, good.targets, -100, good.row_weights};
      try {
        loss->compute(no_teacher);
        ADD_FAILURE() << "kl_weight > 0 without a teacher was accepted";
      } catch (const PluginCallError& e) {
        EXPECT_CONTAINS(e.what(), "reads the teacher's");
      }
    }
  }
}

TEST(AllLosses, MemoryEstimatesAreOneChunkPlusDh) {
  // The DFlash shape in bf16 with the teacher: [N, V] in fp32 would be 30 GiB.
  const dflash_teacher_kind teachers[] = {DFLASH_TEACHER_NONE, DFLASH_TEACHER_HIDDEN, DFLASH_TEACHER_TOPK,
                                          DFLASH_TEACHER_HIDDEN};
  size_t i = 0;
  for (const auto& p : kAll) {
    dflash_loss_shape shape{sizeof(dflash_loss_shape), 32768, 5120, 248320, 64, teachers[i++], 2, 0};
    const auto estimate = make_loss(p.name, p.config)->estimate_memory(shape);
    ASSERT_TRUE(estimate) << p.name;
    const uint64_t saved = 32768ull * 5120ull * 2ull + 32768ull * 16 * 8;
    EXPECT_LE(estimate->peak_bytes, (4ull << 30) + saved) << p.name << ": one chunk (the 4 GiB default budget) + dh";
    EXPECT_EQ(estimate->saved_for_backward_bytes, 32768ull * 5120ull * 2ull + 32768ull * 16 * 8)
        << p.name << ": only dh [N, H] in bf16 and the per-row outputs";
  }
}

}  // namespace
