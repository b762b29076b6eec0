// The SDK's chunked-loss toolkit, through the example losses it ships
// (sdk/examples: weighted CE on autograd, reverse KL with its closed-form
// gradient, JSD on autograd), built from the same sources CI builds out of
// tree and loaded through the host. Each is checked against fp64 autograd of
// its naive full-logits formula (written here, independently) over several
// chunk sizes, reductions, dtypes and a trainable lm_head; then the
// toolkit's own contract: masking, metrics, no gradient wanted, and the
// errors it gives an author whose chunk mathematics returns the wrong thing.
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "support/expect.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>
#include <memory>

namespace {
using namespace dflash::host;

PluginRegistry& registry() {
  static PluginRegistry* instance = [] {
    auto* made = new PluginRegistry();
    made->add_directory(DFLASH_SDK_EXAMPLES_PLUGIN_DIR);
    made->add_directory(DFLASH_CHUNKED_TEST_PLUGIN_DIR);
    return made;
  }();
  return *instance;
}

std::unique_ptr<LossInstance> make_loss(const std::string& name, const nlohmann::json& config) {
  const PluginRecord& record = registry().find(DFLASH_KIND_LOSS, name);
  nlohmann::json full = config;  // defaults from the plugin's schema, as the host fills them
  for (auto& [key, property] : record.schema.at("properties").items())
    if (!full.contains(key)) full[key] = property.at("default");
  return std::make_unique<LossInstance>(record, full, InstanceOptions{});
}

// The naive per-row formulas on full [N, V] logits z (student) and u (teacher).
using RowFormula = std::function<torch::Tensor(const torch::Tensor& z, const torch::Tensor& u, const torch::Tensor& y)>;

RowFormula weighted_ce(double t) {
  return [t](const torch::Tensor& z, const torch::Tensor&, const torch::Tensor& y) {
    return -torch::log_softmax(z / t, 1).gather(1, y.unsqueeze(1)).squeeze(1);
  };
}
RowFormula reverse_kl(double t) {
  return [t](const torch::Tensor& z, const torch::Tensor& u, const torch::Tensor&) {
    const auto q = torch::softmax(z / t, 1);
    return (q * (torch::log(q) - torch::log(torch::softmax(u / t, 1)))).sum(1);
  };
}
RowFormula jsd(double beta, double t) {
  return [beta, t](const torch::Tensor& z, const torch::Tensor& u, const torch::Tensor&) {
    const auto p = torch::softmax(u / t, 1), q = torch::softmax(z / t, 1);
    const auto m = beta * p + (1 - beta) * q;
    return beta * (p * (p.log() - m.log())).sum(1) + (1 - beta) * (q * (q.log() - m.log())).sum(1);
  };
}

struct Inputs {
  torch::Tensor hidden, weight, teacher, targets, row_weights;
};

Inputs make_inputs(int64_t n, int64_t h, int64_t v, uint64_t seed, double ignored = 0.2) {
  torch::manual_seed(seed);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  Inputs in;
  in.hidden = torch::randn({n, h}, f64);
  in.weight = torch::randn({v, h}, f64) * (3.0 / std::sqrt(static_cast<double>(h)));
  in.teacher = in.hidden + 0.7 * torch::randn({n, h}, f64);
  in.targets = torch::randint(0, v, {n}, torch::kLong).masked_fill_(torch::rand({n}, f64).lt(ignored), -100);
  in.row_weights = torch::rand({n}, f64) * 2.0;
  return in;
}

struct Outcome {
  torch::Tensor loss, grad_hidden, grad_weight;
  NamedTensors metrics;
};

// fp64 autograd of the naive formula on the full logits, computed in `dtype`
// for the GEMMs (the same-dtype reference) or fp64 (the truth).
Outcome naive(const Inputs& base, const RowFormula& formula, bool mean, bool trainable, torch::ScalarType dtype,
              torch::Device device = torch::kCPU) {
  const auto math = dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
  const auto hidden = base.hidden.to(device, dtype).detach().requires_grad_(true);
  const auto weight = base.weight.to(device, dtype).detach().requires_grad_(trainable);
  const auto targets = base.targets.to(device);
  const auto valid = targets.ne(-100);
  const auto safe = torch::where(valid, targets, torch::zeros_like(targets));
  const auto z = torch::matmul(hidden, weight.t()).to(math);
  const auto u = torch::matmul(base.teacher.to(device, dtype), weight.t().detach()).to(math);
  const auto w = valid.to(math) * base.row_weights.to(device, math);
  auto loss = (w * torch::where(valid, formula(z, u, safe), torch::zeros({}, z.options()))).sum();
  if (mean) loss = loss / w.sum();
  loss.backward();
  return {loss.detach(), hidden.grad(), trainable ? weight.grad() : torch::Tensor(), {}};
}

Outcome through_plugin(LossInstance& loss, const Inputs& base, bool trainable, torch::ScalarType dtype, bool teacher,
                       torch::Device device = torch::kCPU) {
  const auto hidden = base.hidden.to(device, dtype).detach().requires_grad_(true);
  const auto weight = base.weight.to(device, dtype).detach().requires_grad_(trainable);
  LossCall call{hidden, weight, base.targets.to(device), -100,
                base.row_weights.to(device, dtype == torch::kDouble ? dtype : torch::kFloat)};
  if (teacher) {
    call.teacher = DFLASH_TEACHER_HIDDEN;
    call.teacher_hidden = base.teacher.to(device, dtype);
  }
  LossOutput out = loss.compute(call);
  out.loss.backward();
  return {out.loss.detach(), hidden.grad(), trainable ? weight.grad() : torch::Tensor(), out.metrics};
}

double error(const torch::Tensor& x, const torch::Tensor& truth) {
  return (x.to(torch::kCPU, torch::kDouble) - truth.to(torch::kCPU, torch::kDouble)).abs().max().item<double>();
}

struct Example {
  const char* name;
  nlohmann::json config;
  RowFormula formula;
  bool teacher;
};

const Example kExamples[] = {
    {"example_weighted_ce", {{"temperature", 1.5}}, weighted_ce(1.5), false},
    {"example_reverse_kl", {{"temperature", 2.0}}, reverse_kl(2.0), true},
    {"example_jsd", {{"beta", 0.3}, {"temperature", 1.5}}, jsd(0.3, 1.5), true},
};

// Loss and gradients within `tol` (relative to the truth's scale) of fp64
// autograd of the naive formula, at every chunk size: one row, a size that
// divides nothing, more than N, and the automatic one.
TEST(ChunkedLossExamples, MatchFp64AutogradOfTheNaiveFormulaAtEveryChunkSize) {
  const Inputs base = make_inputs(203, 48, 389, 1);
  for (const Example& ex : kExamples) {
    for (const char* reduction : {"mean", "sum"}) {
      const bool mean = std::string(reduction) == "mean";
      for (const bool trainable : {false, true}) {
        const Outcome truth = naive(base, ex.formula, mean, trainable, torch::kDouble);
        for (int64_t chunk : {1, 7, 64, 1000, 0}) {
          SCOPED_TRACE(std::string(ex.name) + " " + reduction + " chunk " + std::to_string(chunk) +
                       (trainable ? " trainable" : ""));
          nlohmann::json config = ex.config;
          config["chunk_size"] = chunk;
          config["reduction"] = reduction;
          auto loss = make_loss(ex.name, config);
          const Outcome got = through_plugin(*loss, base, trainable, torch::kDouble, ex.teacher);
          const double scale = std::max(1.0, truth.loss.abs().item<double>());
          EXPECT_LT(error(got.loss, truth.loss), 1e-10 * scale);
          EXPECT_LT(error(got.grad_hidden, truth.grad_hidden), 1e-10 * std::max(1.0, truth.grad_hidden.abs().max().item<double>()));
          if (trainable)
            EXPECT_LT(error(got.grad_weight, truth.grad_weight), 1e-10 * std::max(1.0, truth.grad_weight.abs().max().item<double>()));
        }
      }
    }
  }
}

// In fp32, bf16 (and fp16 on CUDA: LibTorch's CPU GEMM has no fp16) the
// toolkit must be as close to the fp64 truth as the naive formula in the
// same dtype on the same device is (twice its error, plus a little).
TEST(ChunkedLossExamples, NarrowDtypesAreAsCloseAsTheNaiveFormulaInTheSameDtype) {
  const Inputs base = make_inputs(150, 64, 300, 2);
  std::vector<std::pair<torch::Device, torch::ScalarType>> runs = {{torch::kCPU, torch::kFloat},
                                                                   {torch::kCPU, torch::kBFloat16}};
  if (torch::cuda::is_available())
    for (auto dtype : {torch::kDouble, torch::kFloat, torch::kBFloat16, torch::kHalf})
      runs.emplace_back(torch::Device(torch::kCUDA, 0), dtype);
  for (const Example& ex : kExamples) {
    const Outcome truth = naive(base, ex.formula, true, false, torch::kDouble);
    for (const auto& [device, dtype] : runs) {
      SCOPED_TRACE(std::string(ex.name) + " " + device.str() + " " + c10::toString(dtype));
      const Outcome reference = naive(base, ex.formula, true, false, dtype, device);
      nlohmann::json config = ex.config;
      config["chunk_size"] = 32;
      const Outcome got = through_plugin(*make_loss(ex.name, config), base, false, dtype, ex.teacher, device);
      const double tol = dtype == torch::kDouble ? 1e-10 : dtype == torch::kFloat ? 1e-5 : 2e-3;
      EXPECT_LE(error(got.loss, truth.loss), 2 * error(reference.loss, truth.loss) + tol);
      const double g_scale = std::max(1e-3, truth.grad_hidden.abs().max().item<double>());
      EXPECT_LE(error(got.grad_hidden, truth.grad_hidden),
                2 * error(reference.grad_hidden, truth.grad_hidden) + tol * g_scale);
    }
  }
}

const torch::Tensor& metric(const NamedTensors& metrics, const std::string& name) {
  for (const auto& [key, tensor] : metrics)
    if (key == name) return tensor;
  throw std::runtime_error("no metric " + name);
}

TEST(ChunkedLossToolkit, ReportsAccuracyTheAuthorsMetricsAndTheChunkMaskedOnIgnoredRows) {
  const Inputs base = make_inputs(100, 16, 50, 3);
  auto loss = make_loss("example_jsd", {{"chunk_size", 30}});
  const Outcome got = through_plugin(*loss, base, false, torch::kDouble, true);
  const auto valid = base.targets.ne(-100);
  const auto logits = torch::matmul(base.hidden, base.weight.t());
  const auto accuracy = (logits.argmax(1).eq(base.targets) & valid).to(torch::kDouble);
  EXPECT_EQ(error(metric(got.metrics, "accuracy"), accuracy), 0.0);
  const auto safe = torch::where(valid, base.targets, torch::zeros_like(base.targets));
  const auto rows = jsd(0.5, 1.0)(logits, torch::matmul(base.teacher, base.weight.t()), safe) * valid;
  EXPECT_LT(error(metric(got.metrics, "jsd"), rows), 1e-12);
  EXPECT_EQ(metric(got.metrics, "chunk_rows").item<double>(), 30.0);
}

TEST(ChunkedLossToolkit, AllRowsIgnoredGiveZeroNotNaN) {
  const Inputs base = make_inputs(40, 16, 50, 4, /*ignored=*/1.1);
  for (const Example& ex : kExamples) {
    for (const char* reduction : {"mean", "sum"}) {
      nlohmann::json config = ex.config;
      config["reduction"] = reduction;
      const Outcome got = through_plugin(*make_loss(ex.name, config), base, true, torch::kFloat, ex.teacher);
      EXPECT_EQ(got.loss.item<double>(), 0.0) << ex.name;
      EXPECT_EQ(got.grad_hidden.abs().max().item<double>(), 0.0) << ex.name;
      EXPECT_EQ(got.grad_weight.abs().max().item<double>(), 0.0) << ex.name;
    }
  }
}

TEST(ChunkedLossToolkit, NoGradientWantedComputesTheLossOnly) {
  const Inputs base = make_inputs(64, 16, 50, 5);
  for (const Example& ex : kExamples) {
    const Outcome truth = naive(base, ex.formula, true, false, torch::kDouble);
    nlohmann::json config = ex.config;
    config["chunk_size"] = 10;
    auto loss = make_loss(ex.name, config);
    const torch::NoGradGuard no_grad;
    LossCall call{base.hidden, base.weight, base.targets, -100, base.row_weights};
    if (ex.teacher) {
      call.teacher = DFLASH_TEACHER_HIDDEN;
      call.teacher_hidden = base.teacher;
    }
    const LossOutput out = loss->compute(call);
    EXPECT_FALSE(out.loss.requires_grad()) << ex.name;
    EXPECT_LT(error(out.loss, truth.loss), 1e-10) << ex.name;
  }
}

// A chunk's mathematics that returns the wrong thing gets an error naming
// the plugin, the method and what it must return (tests/fixtures/plugins/chunked).
TEST(ChunkedLossToolkit, AnAuthorsWrongReturnGetsASpecificError) {
  const Inputs base = make_inputs(20, 8, 30, 6);
  const std::pair<const char*, const char*> cases[] = {
      {"bad_loss_shape", "rows() returned a loss of shape [20, 1]; it must be a floating [20]"},
      {"bad_grad_shape", "rows_and_grad() returned a gradient of shape [20]; with need_grad it must be [20, 30]"},
      {"detached_loss", "rows() returned a loss that does not depend on the logits"},
      {"bad_metric_shape", "rows() returned metric 'mean' of shape []; metrics must be [20]"},
  };
  for (const auto& [name, fragment] : cases) {
    auto loss = make_loss(name, {{"chunk_size", 1000}});
    try {
      through_plugin(*loss, base, false, torch::kFloat, false);
      ADD_FAILURE() << name << " was accepted";
    } catch (const PluginCallError& e) {
      EXPECT_CONTAINS(e.what(), fragment);
      EXPECT_CONTAINS(e.what(), std::string("loss plugin '") + name + "'");
    }
  }
}

TEST(ChunkedLossToolkit, ASchemaWithoutTheToolkitsSettingsIsRefusedAtCreation) {
  try {
    make_loss("no_toolkit_schema", {});
    ADD_FAILURE() << "created";
  } catch (const std::exception& e) {
    EXPECT_CONTAINS(e.what(), "must start from dflash::sdk::chunked_loss_schema()");
  }
}

}  // namespace
