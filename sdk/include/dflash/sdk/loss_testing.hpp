// dflash/sdk/loss_testing.hpp — a loss author's test kit, for a loss built
// out of tree against the installed SDK, with no host and no GPU:
//
//   #include <dflash/sdk/loss_testing.hpp>
//   // ℓ_i of the naive formula on full fp64 logits z = h·Wᵀ, u = h_t·Wᵀ.
//   const auto formula = [](const at::Tensor& z, const at::Tensor& u, const at::Tensor& y) {
//     const at::Tensor log_q = z.log_softmax(1);
//     return (log_q.exp() * (log_q - u.log_softmax(1))).sum(1);
//   };
//   const auto values = dflash::sdk::loss_kit::check_loss_against_reference<ReverseKl>(formula);
//   const auto memory = dflash::sdk::loss_kit::check_loss_memory<ReverseKl>();
//   return values.ok() && memory.ok() ? 0 : 1;  // report() says what differed
//
// check_loss_against_reference: the loss and its gradients (dL/dh, and
// dL/dW with a trainable lm_head) against fp64 autograd of the formula, on a
// batch with ignored rows and row weights, at several chunk sizes and both
// reductions where the loss's schema has chunk_size and reduction (the
// chunked-loss toolkit's settings: chunked_loss.hpp), in fp64 so that any
// difference beyond rounding is a bug.
//
// check_loss_memory: the CPU tensor bytes its compute and backward hold at
// once (the counting allocator, cpu_tensor_counter.hpp) at one batch and at
// four times the rows, with a fixed chunk: a memory-bounded loss grows only
// by per-row tensors, never by [chunk, V] per chunk; and its estimate_memory,
// the planner's figure, covers what it used.
#pragma once

#include <dflash/sdk/cpu_tensor_counter.hpp>
#include <dflash/sdk/loss.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace dflash::sdk::loss_kit {

// ℓ_i per row from full logits: z [N, V] (the student's, fp64, with a graph),
// u [N, V] (the teacher's, no gradient; undefined without a teacher), y [N]
// the targets (ignored rows hold 0, a valid id). Returns [N].
using RowFormula = std::function<at::Tensor(const at::Tensor& z, const at::Tensor& u, const at::Tensor& y)>;

struct CheckShape {
  int64_t rows = 53, hidden = 24, vocab = 131;
  double ignored = 0.2;                // the fraction of rows whose target is the ignore index
  Teacher teacher = Teacher::kHidden;  // what the batch carries: kHidden or kNone
  bool weight_trainable = false;       // the lm_head gets a gradient too
  uint64_t seed = 7;
};

struct CheckResult {
  std::vector<std::string> failures;  // each names its case and what differed, by how much
  int cases = 0;
  double worst_value_error = 0, worst_grad_error = 0;  // relative, over every case
  bool ok() const { return failures.empty(); }
  std::string report() const {
    std::ostringstream out;
    out << cases << " cases, worst relative error: loss " << worst_value_error << ", gradient " << worst_grad_error;
    for (const std::string& f : failures) out << "\n  FAILED " << f;
    return out.str();
  }
};

struct MemoryResult {
  std::vector<std::string> failures;
  int64_t rows = 0, chunk = 0;
  int64_t measured_bytes = 0, measured_bytes_4x = 0;  // at rows and at 4 × rows
  int64_t estimated_bytes = -1;                        // estimate_memory at 4 × rows; −1 when the loss has none
  int64_t full_logits_bytes = 0;                       // one fp32 [4 × rows, V]: what it must stay well under
  bool ok() const { return failures.empty(); }
  std::string report() const {
    std::ostringstream out;
    out << "peak " << measured_bytes << " bytes at " << rows << " rows, " << measured_bytes_4x << " at " << 4 * rows
        << " (chunks of " << chunk << "); estimate_memory " << estimated_bytes << "; full logits " << full_logits_bytes;
    for (const std::string& f : failures) out << "\n  FAILED " << f;
    return out.str();
  }
};

namespace detail {

// The host table the kit creates losses with: logging to stderr, nothing else
// (a loss's compute and estimate_memory, called in C++, use no host function).
inline const dflash_host_api* kit_host() {
  static const dflash_host_api api = [] {
    dflash_host_api a{};
    a.struct_size = sizeof(a);
    a.log = [](int32_t, const char* name, const char* message) { std::fprintf(stderr, "[%s] %s\n", name, message); };
    return a;
  }();
  return &api;
}

// `settings` over the loss's schema defaults, as the host fills them.
template <class L>
nlohmann::json with_defaults(const nlohmann::json& settings) {
  const nlohmann::json schema = nlohmann::json::parse(L::config_schema());
  nlohmann::json full = settings.is_object() ? settings : nlohmann::json::object();
  if (schema.contains("properties"))
    for (const auto& [key, property] : schema.at("properties").items())
      if (!full.contains(key) && property.contains("default")) full[key] = property.at("default");
  return full;
}

template <class L>
bool schema_has(const std::string& key) {
  const nlohmann::json schema = nlohmann::json::parse(L::config_schema());
  return schema.contains("properties") && schema.at("properties").contains(key);
}

template <class L>
std::unique_ptr<L> make_loss(const nlohmann::json& config, const char* dtype) {
  const std::string text = config.dump();
  dflash_create_args args{};
  args.struct_size = sizeof(args);
  args.config_json = text.c_str();
  args.device = "cpu";
  args.dtype = dtype;
  return std::make_unique<L>(CreateContext(kit_host(), &args, L::info.name));
}

struct Batch {
  at::Tensor hidden, weight, teacher, targets, row_weights;
};

inline Batch make_batch(const CheckShape& s, at::ScalarType dtype) {
  at::Generator gen = at::detail::createCPUGenerator(s.seed);
  const auto options = at::TensorOptions().dtype(at::kDouble);
  Batch b;
  b.hidden = at::randn({s.rows, s.hidden}, gen, options);
  b.weight = at::randn({s.vocab, s.hidden}, gen, options) * (3.0 / std::sqrt(static_cast<double>(s.hidden)));
  b.teacher = b.hidden + 0.7 * at::randn({s.rows, s.hidden}, gen, options);
  b.targets = at::randint(0, s.vocab, {s.rows}, gen, at::TensorOptions().dtype(at::kLong))
                  .masked_fill_(at::rand({s.rows}, gen, options).lt(s.ignored), DFLASH_IGNORE_INDEX);
  b.row_weights = at::rand({s.rows}, gen, options) * 2.0;
  for (at::Tensor* t : {&b.hidden, &b.weight, &b.teacher, &b.row_weights}) *t = t->to(dtype);
  return b;
}

inline LossInputs inputs_of(const Batch& b, const CheckShape& s, const at::Tensor& hidden, const at::Tensor& weight) {
  LossInputs in;
  in.hidden = hidden;
  in.lm_head_weight = weight;
  in.targets = b.targets;
  in.row_weights = b.row_weights;
  in.teacher = s.teacher;
  if (s.teacher == Teacher::kHidden) in.teacher_hidden = b.teacher;
  return in;
}

inline double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-30);
  return (got.to(at::kDouble) - want).abs().max().item<double>() / scale;
}

}  // namespace detail

// The loss L (a class written on the SDK) against `reference` over chunk
// sizes (0: automatic) and reductions. `settings`: the loss's own settings
// (e.g. a temperature); the kit sets chunk_size and reduction itself. A loss
// whose schema has no reduction is taken as "mean": Σ c_i ℓ_i with c_i = w_i
// / Σ_valid w.
template <class L>
CheckResult check_loss_against_reference(const RowFormula& reference, const nlohmann::json& settings = {},
                                         const std::vector<int64_t>& chunk_sizes = {1, 7, 64, 0}, CheckShape shape = {},
                                         double tolerance = 1e-9) {
  CheckResult result;
  const detail::Batch b = detail::make_batch(shape, at::kDouble);
  // The reference: full logits, fp64, autograd.
  const at::Tensor valid = b.targets.ne(DFLASH_IGNORE_INDEX);
  const at::Tensor y = b.targets.masked_fill(valid.logical_not(), 0);
  auto reference_of = [&](bool mean, at::Tensor& grad_h, at::Tensor& grad_w) {
    const at::Tensor h = b.hidden.clone().requires_grad_(true);
    const at::Tensor w = b.weight.clone().requires_grad_(shape.weight_trainable);
    const at::Tensor z = h.matmul(w.t());
    const at::Tensor u = shape.teacher == Teacher::kHidden ? b.teacher.matmul(b.weight.t()) : at::Tensor();
    const at::Tensor weights = b.row_weights * valid.to(at::kDouble);
    const double total = weights.sum().item<double>();
    const at::Tensor c = mean ? (total > 0 ? weights / total : at::zeros_like(weights)) : weights;
    const at::Tensor rows = at::where(valid, reference(z, u, y), at::zeros({}, z.options()));
    const at::Tensor loss = (c * rows).sum();
    loss.backward();
    grad_h = h.grad();
    grad_w = shape.weight_trainable ? w.grad() : at::Tensor();
    return loss.item<double>();
  };
  std::vector<std::string> reductions = {"mean"};
  if (detail::schema_has<L>("reduction")) reductions = {"mean", "sum"};
  std::vector<int64_t> chunks = chunk_sizes;
  if (!detail::schema_has<L>("chunk_size")) chunks = {-1};
  for (const std::string& reduction : reductions) {
    at::Tensor want_h, want_w;
    const double want = reference_of(reduction == "mean", want_h, want_w);
    for (int64_t chunk : chunks) {
      nlohmann::json config = settings.is_object() ? settings : nlohmann::json::object();
      if (detail::schema_has<L>("reduction")) config["reduction"] = reduction;
      if (chunk >= 0) config["chunk_size"] = chunk;
      const std::string name = std::string(L::info.name) + ", reduction " + reduction +
                               (chunk >= 0 ? ", chunk_size " + std::to_string(chunk) : std::string());
      ++result.cases;
      try {
        auto loss = detail::make_loss<L>(detail::with_defaults<L>(config), "float64");
        const at::Tensor h = b.hidden.clone().requires_grad_(true);
        const at::Tensor w = b.weight.clone().requires_grad_(shape.weight_trainable);
        const LossResult got = loss->compute(detail::inputs_of(b, shape, h, w));
        if (!got.loss.defined() || got.loss.dim() != 0) {
          result.failures.push_back(name + ": compute returned no 0-dim loss");
          continue;
        }
        got.loss.backward();
        const double value_error = std::abs(got.loss.item<double>() - want) / std::max(1.0, std::abs(want));
        result.worst_value_error = std::max(result.worst_value_error, value_error);
        if (!(value_error <= tolerance))
          result.failures.push_back(name + ": loss " + std::to_string(got.loss.item<double>()) + ", the formula's " +
                                    std::to_string(want) + " (relative error " + std::to_string(value_error) + ")");
        if (!h.grad().defined()) {
          result.failures.push_back(name + ": no gradient reached hidden");
          continue;
        }
        const double grad_error = detail::relative_error(h.grad(), want_h);
        result.worst_grad_error = std::max(result.worst_grad_error, grad_error);
        if (!(grad_error <= tolerance))
          result.failures.push_back(name + ": dL/dh differs from the formula's by " + std::to_string(grad_error) + " (relative)");
        if (shape.weight_trainable) {
          if (!w.grad().defined()) {
            result.failures.push_back(name + ": no gradient reached the trainable lm_head");
          } else {
            const double w_error = detail::relative_error(w.grad(), want_w);
            result.worst_grad_error = std::max(result.worst_grad_error, w_error);
            if (!(w_error <= tolerance))
              result.failures.push_back(name + ": dL/dW differs from the formula's by " + std::to_string(w_error) + " (relative)");
          }
        }
      } catch (const std::exception& e) {
        result.failures.push_back(name + ": threw " + e.what());
      }
    }
  }
  return result;
}

// The loss's CPU memory at `shape.rows` and 4 × rows with chunk_size `chunk`
// (where its schema has one), fp32. Fails when the peak grows by more than
// the per-row tensors (four [N, H] fp32 and sixteen fp64 values a row) from
// one to the other, or when the loss's estimate_memory (if it has one) is
// below the peak it measured.
template <class L>
MemoryResult check_loss_memory(const nlohmann::json& settings = {}, CheckShape shape = {512, 64, 4096}, int64_t chunk = 32) {
  install_cpu_tensor_counter();
  MemoryResult result;
  result.rows = shape.rows;
  result.chunk = chunk;
  nlohmann::json config = settings.is_object() ? settings : nlohmann::json::object();
  if (detail::schema_has<L>("chunk_size")) config["chunk_size"] = chunk;
  auto peak_at = [&](int64_t rows, int64_t* estimate) {
    CheckShape s = shape;
    s.rows = rows;
    const detail::Batch b = detail::make_batch(s, at::kFloat);
    auto loss = detail::make_loss<L>(detail::with_defaults<L>(config), "float32");
    if constexpr (sdk::detail::has_estimate_memory<L>::value) {
      if (estimate != nullptr) {
        LossShape ls;
        ls.rows = rows;
        ls.hidden = s.hidden;
        ls.vocab = s.vocab;
        ls.teacher = s.teacher;
        ls.element_bytes = 4;
        ls.weight_trainable = s.weight_trainable;
        *estimate = static_cast<int64_t>(loss->estimate_memory(ls).peak_bytes);
      }
    }
    const at::Tensor h = b.hidden.clone().requires_grad_(true);
    const at::Tensor w = b.weight.clone().requires_grad_(s.weight_trainable);
    const int64_t before = cpu_tensor_bytes().current;
    reset_cpu_tensor_peak();
    {
      const LossResult got = loss->compute(detail::inputs_of(b, s, h, w));
      got.loss.backward();
    }
    return cpu_tensor_bytes().peak - before;
  };
  try {
    result.measured_bytes = peak_at(shape.rows, nullptr);
    result.measured_bytes_4x = peak_at(4 * shape.rows, &result.estimated_bytes);
  } catch (const std::exception& e) {
    result.failures.push_back(std::string(L::info.name) + ": threw " + e.what());
    return result;
  }
  result.full_logits_bytes = 4 * shape.rows * shape.vocab * 4;
  const int64_t per_row = 4 * shape.hidden * 4 + 16 * 8;
  if (result.measured_bytes_4x - result.measured_bytes > 3 * shape.rows * per_row)
    result.failures.push_back(std::string(L::info.name) + ": the peak grew by " +
                              std::to_string(result.measured_bytes_4x - result.measured_bytes) + " bytes from " +
                              std::to_string(shape.rows) + " to " + std::to_string(4 * shape.rows) +
                              " rows, more than per-row tensors explain (" + std::to_string(3 * shape.rows * per_row) +
                              "): something of [rows, V] or [chunk, V] per chunk is kept");
  if (result.estimated_bytes >= 0 && result.estimated_bytes < result.measured_bytes_4x)
    result.failures.push_back(std::string(L::info.name) + ": estimate_memory says " +
                              std::to_string(result.estimated_bytes) + " bytes, below the " +
                              std::to_string(result.measured_bytes_4x) + " measured: the planner would be short");
  return result;
}

}  // namespace dflash::sdk::loss_kit
