// An independent, direct implementation of the dflash loss family (the
// formulas of docs/losses.md), used as ground truth (in fp64) and as the
// same-dtype naive reference. Written separately from the plugins on purpose:
// the top-K "rest" bucket is summed over the complement here, where the
// plugin uses 1 − Σ top-K.
#pragma once

#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <limits>

namespace dflash::test {

enum class TeacherSignal { kNone, kHidden, kTopK };

struct LossSpec {
  double alpha = 0.0;  // kl_weight
  double temperature = 1.0;
  bool mean = true;
  TeacherSignal teacher = TeacherSignal::kNone;
  int64_t ignore_index = -100;
};

struct LossInputsT {
  torch::Tensor hidden, weight, targets, row_weights, teacher_hidden, topk_ids, topk_logprobs;
  torch::Tensor teacher_weight;  // [V, H_t], or undefined: the teacher goes through `weight`
};

// Loss as a function of (hidden, weight) in `math` dtype; logits are formed
// in the dtype of `hidden`/`weight` (so a bf16 call is the naive bf16 path).
inline torch::Tensor direct_loss(const LossInputsT& in, const LossSpec& spec, torch::ScalarType math) {
  const auto valid = in.targets.ne(spec.ignore_index);
  const auto safe = torch::where(valid, in.targets, torch::zeros_like(in.targets));
  auto w = valid.to(math);
  if (in.row_weights.defined()) w = w * in.row_weights.to(math);
  const auto z = torch::matmul(in.hidden, in.weight.t()).to(math);
  const auto log_softmax_z = torch::log_softmax(z, 1);
  const auto ce = -log_softmax_z.gather(1, safe.unsqueeze(1)).squeeze(1);
  auto row = (1.0 - spec.alpha) * ce;
  const double t = spec.temperature;
  if (spec.alpha > 0 && spec.teacher == TeacherSignal::kHidden) {
    const torch::Tensor& teacher_weight = in.teacher_weight.defined() ? in.teacher_weight : in.weight;
    const auto u = torch::matmul(in.teacher_hidden, teacher_weight.t()).to(math).detach();
    const auto p = torch::softmax(u / t, 1);
    const auto kl = (p * (torch::log_softmax(u / t, 1) - torch::log_softmax(z / t, 1))).sum(1);
    row = row + spec.alpha * t * t * kl;
  } else if (spec.alpha > 0 && spec.teacher == TeacherSignal::kTopK) {
    const auto n = z.size(0);
    const auto q = torch::softmax(z / t, 1);
    const auto in_topk = torch::zeros_like(q).scatter_(1, in.topk_ids, 1.0).to(torch::kBool);
    const auto q_k = q.gather(1, in.topk_ids);
    const auto q_rest = torch::where(in_topk, torch::zeros_like(q), q).sum(1, true);
    // Teacher buckets, tempered: b^(1/T) renormalised.
    const auto t_k = in.topk_logprobs.to(math).exp();
    // With K = V there is no rest: what 1 − Σ leaves is rounding.
    const auto t_rest = in.topk_ids.size(1) == q.size(1) ? torch::zeros_like(t_k.narrow(1, 0, 1))
                                                           : (1.0 - t_k.sum(1, true)).clamp_min(0);
    auto buckets = torch::cat({t_k, t_rest}, 1).pow(1.0 / t);
    buckets = (buckets / buckets.sum(1, true)).detach();
    const auto student = torch::cat({q_k, q_rest}, 1);
    const auto positive = buckets.gt(0);
    const auto safe_t = torch::where(positive, buckets, torch::ones_like(buckets));
    const auto safe_s = torch::where(positive, student, torch::ones_like(student));
    const auto kl = torch::where(positive, buckets * (safe_t.log() - safe_s.log()), torch::zeros_like(buckets)).sum(1);
    (void)n;
    row = row + spec.alpha * t * t * kl;
  }
  auto total = (w * row).sum();
  if (spec.mean) {
    const auto denominator = w.sum();
    total = denominator.item<double>() > 0 ? total / denominator : total * 0;
  }
  return total;
}

}  // namespace dflash::test
