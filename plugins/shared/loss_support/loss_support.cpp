#include "loss_support.h"

#include <cmath>
#include <sstream>

namespace dflash::loss {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

[[noreturn]] void fail(const std::string& message) { throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, message); }

void expect_floating(const at::Tensor& t, const char* name) {
  if (!at::isFloatingType(t.scalar_type()))
    fail(std::string(name) + " must be a floating tensor, got " + c10::toString(t.scalar_type()));
}

void expect_same_device(const at::Tensor& t, const at::Tensor& reference, const char* name) {
  if (t.device() != reference.device())
    fail(std::string(name) + " is on " + t.device().str() + " but hidden is on " + reference.device().str() +
         "; the host places every input on one device");
}

void expect_finite(const at::Tensor& t, const char* name) {
  const at::Tensor bad = t.isfinite().logical_not();
  if (bad.any().item<bool>()) {
    const int64_t first = bad.flatten().nonzero().select(1, 0)[0].item<int64_t>();
    const int64_t row = t.dim() >= 2 ? first / std::max<int64_t>(t.size(1), 1) : first;
    fail(std::string(name) + " contains NaN or Inf (first at row " + std::to_string(row) + ")");
  }
}

}  // namespace

sdk::Schema& add_reduction(sdk::Schema& schema) {
  return schema.string("reduction", "mean",
                       "mean: Σ w·ℓ / Σ w over supervised rows; sum: Σ w·ℓ", {"mean", "sum"});
}

sdk::Schema& add_distillation(sdk::Schema& schema, double default_kl_weight) {
  using sdk::Bounds;
  return schema
      .number("kl_weight", default_kl_weight,
              "α in (1 − α)·CE + α·T²·KL(teacher ‖ student); 0 = CE only, 1 = KL only", Bounds::between(0, 1))
      .number("temperature", 1.0, "T of the distillation term (CE stays at temperature 1)", Bounds::above(0));
}

LossSettings read_settings(const nlohmann::json& config) {
  LossSettings s;
  if (config.contains("temperature")) s.temperature = config.at("temperature").get<double>();
  if (config.contains("kl_weight")) s.kl_weight = config.at("kl_weight").get<double>();
  if (config.contains("reduction")) s.mean = config.at("reduction").get<std::string>() == "mean";
  if (config.contains("topk")) s.topk = config.at("topk").get<int64_t>();
  if (config.contains("chunk_size")) s.chunk_size = config.at("chunk_size").get<int64_t>();
  if (config.contains("chunk_memory_mb")) s.chunk_memory_mb = config.at("chunk_memory_mb").get<double>();
  return s;
}

at::ScalarType math_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

void validate_inputs(const sdk::LossInputs& in, TeacherNeed teacher) {
  const at::Tensor& h = in.hidden;
  const at::Tensor& w = in.lm_head_weight;
  if (!h.defined() || h.dim() != 2) fail("hidden must be [N, H], got " + (h.defined() ? shape_of(h) : "nothing"));
  if (!w.defined() || w.dim() != 2) fail("lm_head_weight must be [V, H], got " + (w.defined() ? shape_of(w) : "nothing"));
  expect_floating(h, "hidden");
  if (w.scalar_type() != h.scalar_type())
    fail(std::string("lm_head_weight is ") + c10::toString(w.scalar_type()) + " but hidden is " +
         c10::toString(h.scalar_type()) + "; both must have one dtype");
  if (w.size(1) != h.size(1))
    fail("lm_head_weight is " + shape_of(w) + " but hidden is " + shape_of(h) + "; their H must agree");
  expect_same_device(w, h, "lm_head_weight");
  const int64_t n = h.size(0), v = w.size(0);
  const at::Tensor& t = in.targets;
  if (!t.defined() || t.dim() != 1 || t.size(0) != n)
    fail("targets must be [N] = [" + std::to_string(n) + "], got " + (t.defined() ? shape_of(t) : "nothing"));
  if (t.scalar_type() != at::kLong) fail(std::string("targets must be int64, got ") + c10::toString(t.scalar_type()));
  expect_same_device(t, h, "targets");
  const at::Tensor out_of_range = t.ne(in.ignore_index).logical_and(t.lt(0).logical_or(t.ge(v)));
  if (out_of_range.any().item<bool>()) {
    const int64_t row = out_of_range.nonzero()[0][0].item<int64_t>();
    fail("targets[" + std::to_string(row) + "] = " + std::to_string(t[row].item<int64_t>()) +
         " is outside the vocabulary [0, " + std::to_string(v) + ") and is not the ignore index " +
         std::to_string(in.ignore_index));
  }
  if (in.row_weights.defined()) {
    const at::Tensor& rw = in.row_weights;
    if (rw.dim() != 1 || rw.size(0) != n) fail("row_weights must be [N] = [" + std::to_string(n) + "], got " + shape_of(rw));
    expect_floating(rw, "row_weights");
    expect_same_device(rw, h, "row_weights");
    expect_finite(rw, "row_weights");
    if (rw.lt(0).any().item<bool>()) fail("row_weights must be >= 0");
  }
  if (teacher == TeacherNeed::kHidden) {
    if (in.teacher != sdk::Teacher::kHidden || !in.teacher_hidden.defined())
      fail("kl_weight > 0 needs teacher hidden states (teacher_kind HIDDEN); set kl_weight to 0 for CE only");
    const at::Tensor& th = in.teacher_hidden;
    if (!th.sizes().equals(h.sizes())) fail("teacher_hidden must be " + shape_of(h) + " like hidden, got " + shape_of(th));
    if (th.scalar_type() != h.scalar_type())
      fail(std::string("teacher_hidden is ") + c10::toString(th.scalar_type()) + " but hidden is " +
           c10::toString(h.scalar_type()));
    expect_same_device(th, h, "teacher_hidden");
    expect_finite(th, "teacher_hidden");
  } else if (teacher == TeacherNeed::kTopK) {
    if (in.teacher != sdk::Teacher::kTopK || !in.teacher_topk_ids.defined() || !in.teacher_topk_logprobs.defined())
      fail("kl_weight > 0 needs the teacher's top-K ids and log-probs (teacher_kind TOPK); set kl_weight to 0 for CE only");
    const at::Tensor& ids = in.teacher_topk_ids;
    const at::Tensor& lp = in.teacher_topk_logprobs;
    if (ids.dim() != 2 || ids.size(0) != n) fail("teacher_topk_ids must be [N, K], got " + shape_of(ids));
    if (!lp.sizes().equals(ids.sizes()))
      fail("teacher_topk_logprobs is " + shape_of(lp) + " but teacher_topk_ids is " + shape_of(ids));
    if (ids.scalar_type() != at::kLong) fail("teacher_topk_ids must be int64");
    expect_floating(lp, "teacher_topk_logprobs");
    expect_same_device(ids, h, "teacher_topk_ids");
    expect_same_device(lp, h, "teacher_topk_logprobs");
    if (ids.size(1) < 1 || ids.size(1) > v) fail("teacher top-K must have 1 <= K <= V, got K = " + std::to_string(ids.size(1)));
    if (ids.lt(0).logical_or(ids.ge(v)).any().item<bool>())
      fail("teacher_topk_ids has ids outside the vocabulary [0, " + std::to_string(v) + ")");
    expect_finite(lp, "teacher_topk_logprobs");
    // log-probs are <= 0 and their mass is at most 1 (small slack for rounding).
    if (lp.gt(1e-4).any().item<bool>()) fail("teacher_topk_logprobs must be log-probabilities (<= 0)");
    if (lp.to(at::kDouble).exp().sum(1).gt(1.0 + 1e-3).any().item<bool>())
      fail("teacher_topk_logprobs of a row sum to more than probability 1");
  }
}

RowCoefficients row_coefficients(const sdk::LossInputs& in, bool mean) {
  const at::ScalarType math = math_dtype(in.hidden.scalar_type());
  RowCoefficients rows;
  rows.valid = in.targets.ne(in.ignore_index);
  rows.safe_targets = at::where(rows.valid, in.targets, at::zeros_like(in.targets));
  at::Tensor weight = rows.valid.to(math);
  if (in.row_weights.defined()) weight = weight * in.row_weights.to(math);
  if (mean) {
    const at::Tensor total = weight.sum();
    // All rows ignored (or weighted 0): coefficients 0, loss 0, no NaN.
    weight = at::where(total.gt(0), weight / total.clamp_min(1e-30), at::zeros_like(weight));
  }
  rows.coefficient = weight;
  return rows;
}

FullLogits full_logits(const sdk::LossInputs& in, const RowCoefficients& rows) {
  FullLogits out;
  out.logits = at::matmul(in.hidden, in.lm_head_weight.t()).to(math_dtype(in.hidden.scalar_type()));
  out.ce_rows = out.logits.logsumexp(1) - out.logits.gather(1, rows.safe_targets.unsqueeze(1)).squeeze(1);
  return out;
}

sdk::LossResult finish_full(const sdk::LossInputs& in, const RowCoefficients& rows, const FullLogits& student,
                            const at::Tensor& row_loss, const at::Tensor& kl_rows) {
  sdk::LossResult result;
  result.loss = (rows.coefficient * row_loss).sum();
  add_metrics(result, student.ce_rows, kl_rows, student.logits.detach().argmax(1).eq(in.targets), rows, in);
  return result;
}

void add_metrics(sdk::LossResult& result, const at::Tensor& ce_rows, const at::Tensor& kl_rows,
                 const at::Tensor& correct_rows, const RowCoefficients& rows, const sdk::LossInputs& in) {
  const c10::NoGradGuard no_grad;
  const at::Tensor valid = rows.valid.to(ce_rows.scalar_type());
  at::Tensor weight = valid;
  if (in.row_weights.defined()) weight = weight * in.row_weights.to(ce_rows.scalar_type());
  const at::Tensor total = weight.sum().clamp_min(1e-30);
  const at::Tensor ce = ce_rows.detach() * valid;
  result.metrics.set("ce", ce);
  result.metrics.set("weighted_ce", (ce * weight).sum() / total);
  if (kl_rows.defined()) {
    const at::Tensor kl = kl_rows.detach() * valid;
    result.metrics.set("kl", kl);
    result.metrics.set("weighted_kl", (kl * weight).sum() / total);
  }
  result.metrics.set("accuracy", correct_rows.to(ce_rows.scalar_type()) * valid);
}

}  // namespace dflash::loss
