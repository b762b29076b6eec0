// dflash/sdk/loss_checks.hpp — the checks every loss runs on its inputs:
// shapes, dtypes, devices and values, each failure naming the tensor and
// what was expected. The chunked-loss toolkit (chunked_loss.hpp) runs them
// for its losses; a loss written without it calls check_loss_inputs itself.
#pragma once

#include <dflash/sdk/loss.hpp>

#include <ATen/ATen.h>

#include <sstream>
#include <string>

namespace dflash::sdk {

// The dtype the softmax arithmetic of a loss runs in for an input dtype:
// fp64 for fp64, fp32 for everything narrower (bf16 / fp16 sums lose mass).
inline at::ScalarType loss_math_dtype(at::ScalarType input) { return input == at::kDouble ? at::kDouble : at::kFloat; }

namespace detail {

inline std::string shape_text(const at::Tensor& t) {
  if (!t.defined()) return "nothing";
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

[[noreturn]] inline void bad_loss_input(const std::string& message) { throw Error(DFLASH_ERR_INVALID_ARGUMENT, message); }

inline void expect_floating(const at::Tensor& t, const char* name) {
  if (!at::isFloatingType(t.scalar_type()))
    bad_loss_input(std::string(name) + " must be a floating tensor, got " + c10::toString(t.scalar_type()));
}

inline void expect_same_device(const at::Tensor& t, const at::Tensor& hidden, const char* name) {
  if (t.device() != hidden.device())
    bad_loss_input(std::string(name) + " is on " + t.device().str() + " but hidden is on " + hidden.device().str() +
                   "; the host places every input on one device");
}

inline void expect_finite(const at::Tensor& t, const char* name) {
  const at::Tensor bad = t.isfinite().logical_not();
  if (bad.any().item<bool>()) {
    const int64_t first = bad.flatten().nonzero().select(1, 0)[0].item<int64_t>();
    const int64_t row = t.dim() >= 2 ? first / std::max<int64_t>(t.size(1), 1) : first;
    bad_loss_input(std::string(name) + " contains NaN or Inf (first at row " + std::to_string(row) + ")");
  }
}

inline void check_teacher_hidden(const LossInputs& in) {
  if (in.teacher != Teacher::kHidden || !in.teacher_hidden.defined())
    bad_loss_input("this loss reads the teacher's hidden states (teacher_kind HIDDEN), and none came; "
                   "a distillation loss blended with CE takes kl_weight = 0 for CE only");
  const at::Tensor& th = in.teacher_hidden;
  if (in.teacher_lm_head_weight.defined()) {
    // The teacher's own head (ABI 1.6): [V, H_t] over the student's V tokens,
    // and teacher_hidden [N, H_t].
    const at::Tensor& tw = in.teacher_lm_head_weight;
    if (tw.dim() != 2 || tw.size(0) != in.lm_head_weight.size(0))
      bad_loss_input("teacher_lm_head_weight must be [V, H_t] with the V = " + std::to_string(in.lm_head_weight.size(0)) +
                     " of lm_head_weight " + shape_text(in.lm_head_weight) + ", got " + shape_text(tw));
    if (tw.scalar_type() != in.lm_head_weight.scalar_type())
      bad_loss_input(std::string("teacher_lm_head_weight is ") + c10::toString(tw.scalar_type()) + " but lm_head_weight is " +
                     c10::toString(in.lm_head_weight.scalar_type()));
    expect_same_device(tw, in.hidden, "teacher_lm_head_weight");
    if (th.dim() != 2 || th.size(0) != in.hidden.size(0) || th.size(1) != tw.size(1))
      bad_loss_input("teacher_hidden must be [N, H_t] = [" + std::to_string(in.hidden.size(0)) + ", " +
                     std::to_string(tw.size(1)) + "] for teacher_lm_head_weight " + shape_text(tw) + ", got " + shape_text(th));
  } else if (!th.sizes().equals(in.hidden.sizes())) {
    bad_loss_input("teacher_hidden must be " + shape_text(in.hidden) + " like hidden, got " + shape_text(th));
  }
  if (th.scalar_type() != in.hidden.scalar_type())
    bad_loss_input(std::string("teacher_hidden is ") + c10::toString(th.scalar_type()) + " but hidden is " +
                   c10::toString(in.hidden.scalar_type()));
  expect_same_device(th, in.hidden, "teacher_hidden");
  expect_finite(th, "teacher_hidden");
}

inline void check_teacher_topk(const LossInputs& in, int64_t vocab) {
  if (in.teacher != Teacher::kTopK || !in.teacher_topk_ids.defined() || !in.teacher_topk_logprobs.defined())
    bad_loss_input("this loss reads the teacher's top-K ids and log-probs (teacher_kind TOPK), and none came; "
                   "a distillation loss blended with CE takes kl_weight = 0 for CE only");
  const at::Tensor& ids = in.teacher_topk_ids;
  const at::Tensor& lp = in.teacher_topk_logprobs;
  const int64_t n = in.hidden.size(0);
  if (ids.dim() != 2 || ids.size(0) != n) bad_loss_input("teacher_topk_ids must be [N, K], got " + shape_text(ids));
  if (!lp.sizes().equals(ids.sizes()))
    bad_loss_input("teacher_topk_logprobs is " + shape_text(lp) + " but teacher_topk_ids is " + shape_text(ids));
  if (ids.scalar_type() != at::kLong) bad_loss_input("teacher_topk_ids must be int64");
  expect_floating(lp, "teacher_topk_logprobs");
  expect_same_device(ids, in.hidden, "teacher_topk_ids");
  expect_same_device(lp, in.hidden, "teacher_topk_logprobs");
  if (ids.size(1) < 1 || ids.size(1) > vocab)
    bad_loss_input("teacher top-K must have 1 <= K <= V, got K = " + std::to_string(ids.size(1)));
  if (ids.lt(0).logical_or(ids.ge(vocab)).any().item<bool>())
    bad_loss_input("teacher_topk_ids has ids outside the vocabulary [0, " + std::to_string(vocab) + ")");
  expect_finite(lp, "teacher_topk_logprobs");
  // Log-probs are <= 0 and their mass is at most 1 (small slack for rounding).
  if (lp.gt(1e-4).any().item<bool>()) bad_loss_input("teacher_topk_logprobs must be log-probabilities (<= 0)");
  if (lp.to(at::kDouble).exp().sum(1).gt(1.0 + 1e-3).any().item<bool>())
    bad_loss_input("teacher_topk_logprobs of a row sum to more than probability 1");
}

}  // namespace detail

// Checks a loss's inputs; throws Error(DFLASH_ERR_INVALID_ARGUMENT) naming
// the tensor and what was expected. `teacher` is the teacher signal the loss
// will read (Teacher::kNone when it reads none).
inline void check_loss_inputs(const LossInputs& in, Teacher teacher) {
  using detail::bad_loss_input;
  using detail::shape_text;
  const at::Tensor& h = in.hidden;
  const at::Tensor& w = in.lm_head_weight;
  if (!h.defined() || h.dim() != 2) bad_loss_input("hidden must be [N, H], got " + shape_text(h));
  if (!w.defined() || w.dim() != 2) bad_loss_input("lm_head_weight must be [V, H], got " + shape_text(w));
  detail::expect_floating(h, "hidden");
  if (w.scalar_type() != h.scalar_type())
    bad_loss_input(std::string("lm_head_weight is ") + c10::toString(w.scalar_type()) + " but hidden is " +
                   c10::toString(h.scalar_type()) + "; both must have one dtype");
  if (w.size(1) != h.size(1))
    bad_loss_input("lm_head_weight is " + shape_text(w) + " but hidden is " + shape_text(h) + "; their H must agree");
  detail::expect_same_device(w, h, "lm_head_weight");
  const int64_t n = h.size(0), v = w.size(0);
  const at::Tensor& t = in.targets;
  if (!t.defined() || t.dim() != 1 || t.size(0) != n)
    bad_loss_input("targets must be [N] = [" + std::to_string(n) + "], got " + shape_text(t));
  if (t.scalar_type() != at::kLong) bad_loss_input(std::string("targets must be int64, got ") + c10::toString(t.scalar_type()));
  detail::expect_same_device(t, h, "targets");
  const at::Tensor out_of_range = t.ne(in.ignore_index).logical_and(t.lt(0).logical_or(t.ge(v)));
  if (out_of_range.any().item<bool>()) {
    const int64_t row = out_of_range.nonzero()[0][0].item<int64_t>();
    bad_loss_input("targets[" + std::to_string(row) + "] = " + std::to_string(t[row].item<int64_t>()) +
                   " is outside the vocabulary [0, " + std::to_string(v) + ") and is not the ignore index " +
                   std::to_string(in.ignore_index));
  }
  if (in.row_weights.defined()) {
    const at::Tensor& rw = in.row_weights;
    if (rw.dim() != 1 || rw.size(0) != n)
      bad_loss_input("row_weights must be [N] = [" + std::to_string(n) + "], got " + shape_text(rw));
    detail::expect_floating(rw, "row_weights");
    detail::expect_same_device(rw, h, "row_weights");
    detail::expect_finite(rw, "row_weights");
    if (rw.lt(0).any().item<bool>()) bad_loss_input("row_weights must be >= 0");
  }
  if (teacher == Teacher::kHidden) detail::check_teacher_hidden(in);
  if (teacher == Teacher::kTopK) detail::check_teacher_topk(in, v);
}

}  // namespace dflash::sdk
