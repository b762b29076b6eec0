#include "train/adamw.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
#include <stdexcept>

namespace dflash::train {

AdamW::AdamW(host::NamedTensors parameters, const AdamWOptions& options)
    : parameters_(std::move(parameters)), options_(options) {
  const c10::NoGradGuard no_grad;
  for (const auto& [name, p] : parameters_) {
    const auto state_type = options_.fp32_master ? at::kFloat : p.scalar_type();
    exp_avg_.push_back(at::zeros(p.sizes(), p.options().dtype(state_type)));
    exp_avg_sq_.push_back(at::zeros(p.sizes(), p.options().dtype(state_type)));
    master_.push_back(options_.fp32_master ? p.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true) : at::Tensor());
  }
}

void AdamW::step(double lr) {
  const c10::NoGradGuard no_grad;
  ++steps_;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double correction1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
  const double correction2 = 1.0 - std::pow(b2, static_cast<double>(steps_));
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor p = parameters_[i].second;
    if (!p.grad().defined()) continue;
    const at::Tensor g = p.grad().to(at::kFloat);
    at::Tensor m = exp_avg_[i].to(at::kFloat), v = exp_avg_sq_[i].to(at::kFloat);
    m.mul_(b1).add_(g, 1.0 - b1);
    v.mul_(b2).addcmul_(g, g, 1.0 - b2);
    at::Tensor w = options_.fp32_master ? master_[i] : p.detach().to(at::kFloat);
    // Decoupled weight decay, then the Adam step.
    if (options_.weight_decay != 0) w.mul_(1.0 - lr * options_.weight_decay);
    const at::Tensor denominator = (v / correction2).sqrt_().add_(options_.eps);
    w.addcdiv_(m, denominator, -lr / correction1);
    if (!options_.fp32_master) {
      exp_avg_[i].copy_(m);
      exp_avg_sq_[i].copy_(v);
    }
    p.detach().copy_(w);  // rounds to the live dtype once
  }
}

void AdamW::zero_grad() {
  for (auto& [name, p] : parameters_)
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

host::NamedTensors AdamW::state() const {
  host::NamedTensors out;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const std::string& name = parameters_[i].first;
    out.emplace_back("exp_avg." + name, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + name, exp_avg_sq_[i]);
    if (options_.fp32_master) out.emplace_back("master." + name, master_[i]);
  }
  out.emplace_back("step", at::scalar_tensor(steps_, at::kLong));
  return out;
}

void AdamW::load_state(const host::NamedTensors& state) {
  const c10::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  auto take = [&](const std::string& name, at::Tensor& into) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw std::runtime_error("optimizer state: tensor '" + name + "' is missing");
    if (it->second.sizes() != into.sizes())
      throw std::runtime_error("optimizer state: tensor '" + name + "' has the wrong shape for this drafter");
    into.copy_(it->second);
  };
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const std::string& name = parameters_[i].first;
    take("exp_avg." + name, exp_avg_[i]);
    take("exp_avg_sq." + name, exp_avg_sq_[i]);
    if (options_.fp32_master) take("master." + name, master_[i]);
  }
  auto step = by_name.find("step");
  if (step == by_name.end()) throw std::runtime_error("optimizer state: 'step' is missing");
  steps_ = step->second.item<int64_t>();
}

double global_grad_norm(const host::NamedTensors& parameters) {
  const c10::NoGradGuard no_grad;
  at::Tensor total;
  for (const auto& [name, p] : parameters) {
    if (!p.grad().defined()) continue;
    const at::Tensor sq = p.grad().to(at::kFloat).pow(2).sum();
    total = total.defined() ? total + sq : sq;
  }
  return total.defined() ? std::sqrt(total.item<double>()) : 0.0;
}

void scale_gradients(const host::NamedTensors& parameters, double factor) {
  const c10::NoGradGuard no_grad;
  for (const auto& [name, p] : parameters)
    if (p.grad().defined()) p.grad().mul_(factor);
}

}  // namespace dflash::train
