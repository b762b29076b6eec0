#include "train/adamw.h"

#include "train/adamw_kernel.h"

#include <dflash/sdk/torch_compat.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#ifdef DFLASH_ADAMW_KERNEL
#include <c10/cuda/CUDAStream.h>
#endif

#include <cmath>
#include <cstring>
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

namespace {

// On CUDA with LibTorch ≥ 2.1 the update runs as ATen's fused multi-tensor
// AdamW kernel (one launch per ~dozens of tensors, fp32 arithmetic in
// registers, one rounding on store): the same formula as the per-tensor loop
// below, without its fp32 temporaries and ~10 kernels per tensor.
// `params`, `grads`, `m`, `v` must share a dtype; `steps` are fp32 device
// scalars holding the step number (the kernel reads them for the bias
// corrections).
bool fused_available(const at::Tensor& like) {
#if DFLASH_TORCH_AT_LEAST(2, 1)
  return like.is_cuda();
#else
  (void)like;
  return false;
#endif
}

// grad_scale: undefined, or a one-element fp32 tensor on the device by which
// the kernel divides each gradient (AMP's unscale, here 1 / the clip factor).
void fused_adamw(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, std::vector<at::Tensor> m,
                 std::vector<at::Tensor> v, std::vector<at::Tensor> steps, double lr, const AdamWOptions& o,
                 const at::Tensor& grad_scale) {
#if DFLASH_TORCH_AT_LEAST(2, 1)
  at::_fused_adamw_(params, grads, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, o.beta1, o.beta2, o.weight_decay, o.eps,
                    /*amsgrad=*/false, /*maximize=*/false,
                    grad_scale.defined() ? c10::optional<at::Tensor>(grad_scale) : c10::nullopt);
#else
  (void)params, (void)grads, (void)m, (void)v, (void)steps, (void)lr, (void)o, (void)grad_scale;
  throw std::logic_error("fused AdamW needs LibTorch 2.1 or later");
#endif
}

}  // namespace

void AdamW::fused_step(double lr, double grad_factor) {
  // The step counters, one fp32 scalar per tensor (views of one buffer).
  if (!step_buffer_.defined()) {
    step_buffer_ = at::zeros({static_cast<int64_t>(parameters_.size())}, parameters_.front().second.options().dtype(at::kFloat));
    step_views_ = step_buffer_.unbind();
  }
  step_buffer_.fill_(static_cast<double>(steps_));
  const at::Tensor grad_scale =
      grad_factor == 1.0 ? at::Tensor() : at::full({1}, 1.0 / grad_factor, step_buffer_.options());
  // Tensors in batches of ~256 M elements: fp32_master casts each batch's
  // gradients to fp32 (the kernel wants one dtype) and never all at once.
  constexpr int64_t kBatchElements = int64_t{256} << 20;
  std::vector<at::Tensor> params, grads, m, v, steps;
  std::vector<size_t> members;
  int64_t elements = 0;
  auto flush = [&] {
    if (params.empty()) return;
    fused_adamw(params, grads, m, v, steps, lr, options_, grad_scale);
    if (options_.fp32_master)
      for (size_t i : members) parameters_[i].second.detach().copy_(master_[i]);  // rounds to the live dtype once
    params.clear(), grads.clear(), m.clear(), v.clear(), steps.clear(), members.clear();
    elements = 0;
  };
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor& p = parameters_[i].second;
    if (!p.grad().defined()) continue;
    params.push_back(options_.fp32_master ? master_[i] : p.detach());
    grads.push_back(options_.fp32_master ? p.grad().to(at::kFloat) : p.grad());
    m.push_back(exp_avg_[i]);
    v.push_back(exp_avg_sq_[i]);
    steps.push_back(step_views_[i]);
    members.push_back(i);
    elements += p.numel();
    if (elements >= kBatchElements) flush();
  }
  flush();
}

#ifdef DFLASH_ADAMW_KERNEL
namespace {
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
}  // namespace
#endif

bool AdamW::kernel_step(double lr, double grad_factor) {
#ifdef DFLASH_ADAMW_KERNEL
  namespace k = adamw_kernel;
  const at::Tensor& first = parameters_.front().second;
  const auto live_type = first.scalar_type();
  if (live_type != at::kBFloat16 && live_type != at::kFloat) return false;
  // The kernel's table: one entry per parameter with a gradient, each the
  // parameter's pointers and its first chunk. Anything it cannot take (another
  // dtype or device, a strided tensor) leaves the whole step to ATen's.
  std::vector<k::Tensor> table;
  int64_t chunks = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor& p = parameters_[i].second;
    if (!p.grad().defined()) continue;
    const at::Tensor& g = p.grad();
    if (p.scalar_type() != live_type || g.scalar_type() != live_type || p.device() != first.device() ||
        g.device() != first.device() || !p.is_contiguous() || !g.is_contiguous())
      return false;
    k::Tensor t{};
    t.param = options_.fp32_master ? master_[i].data_ptr() : p.data_ptr();
    t.grad = g.data_ptr();
    t.exp_avg = exp_avg_[i].data_ptr();
    t.exp_avg_sq = exp_avg_sq_[i].data_ptr();
    t.live = options_.fp32_master ? p.data_ptr() : nullptr;
    t.numel = p.numel();
    t.first_chunk = chunks;
    t.vectorized = t.numel % 8 == 0 && aligned16(t.param) && aligned16(t.grad) && aligned16(t.exp_avg) &&
                   aligned16(t.exp_avg_sq) && (t.live == nullptr || aligned16(t.live));
    chunks += (t.numel + k::kChunkElements - 1) / k::kChunkElements;
    if (t.numel > 0) table.push_back(t);
  }
  if (table.empty()) return true;
  // Uploaded through pinned memory without waiting: the caching host
  // allocator keeps the block until the copy has run.
  static_assert(sizeof(k::Tensor) % sizeof(int64_t) == 0, "the table travels as int64");
  const auto words = static_cast<int64_t>(table.size() * sizeof(k::Tensor) / sizeof(int64_t));
  at::Tensor host = at::empty({words}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::memcpy(host.data_ptr(), table.data(), table.size() * sizeof(k::Tensor));
  const at::Tensor device_table = host.to(first.device(), /*non_blocking=*/true);
  const at::Tensor scale =
      grad_factor == 1.0 ? at::Tensor() : at::full({1}, 1.0 / grad_factor, first.options().dtype(at::kFloat));
  k::Scalars s{};
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(options_.beta1);
  s.beta2 = static_cast<float>(options_.beta2);
  s.eps = static_cast<float>(options_.eps);
  s.weight_decay = static_cast<float>(options_.weight_decay);
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(options_.beta1, static_cast<double>(steps_)));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(options_.beta2, static_cast<double>(steps_))));
  s.grad_scale = scale.defined() ? scale.data_ptr<float>() : nullptr;
  k::step(live_type == at::kBFloat16 ? k::Element::kBFloat16 : k::Element::kFloat32, options_.fp32_master,
          reinterpret_cast<const k::Tensor*>(device_table.data_ptr()), static_cast<int64_t>(table.size()), chunks, s,
          c10::cuda::getCurrentCUDAStream(first.device().index()).stream());
  return true;
#else
  (void)lr, (void)grad_factor;
  return false;
#endif
}

void AdamW::step(double lr, double grad_factor) {
  const c10::NoGradGuard no_grad;
  ++steps_;
  if (fused_available(parameters_.empty() ? at::Tensor() : parameters_.front().second) && options_.fused) {
    if (options_.kernel == AdamWOptions::Kernel::kOurs && kernel_step(lr, grad_factor)) {
      last_kernel_ = "ours";
      return;
    }
    last_kernel_ = "aten";
    fused_step(lr, grad_factor);
    return;
  }
  last_kernel_ = "loop";
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double correction1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
  const double correction2 = 1.0 - std::pow(b2, static_cast<double>(steps_));
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor p = parameters_[i].second;
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad().to(at::kFloat);
    if (grad_factor != 1.0) g = g * grad_factor;
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
    if (it->second.scalar_type() != into.scalar_type())
      throw std::runtime_error("optimizer state: tensor '" + name + "' holds " +
                               std::string(c10::toString(it->second.scalar_type())) + " values where the optimizer keeps " +
                               c10::toString(into.scalar_type()) +
                               "; the file was altered, or written with another train.dtype or train.precision");
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
  if (step->second.scalar_type() != at::kLong || step->second.numel() != 1)
    throw std::runtime_error("optimizer state: 'step' must be one int64 value; the file was altered");
  steps_ = step->second.item<int64_t>();
}

double global_grad_norm(const host::NamedTensors& parameters) {
  const c10::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& [name, p] : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
#if DFLASH_TORCH_AT_LEAST(2, 5)
  if (grads.front().is_cuda()) {
    // One multi-tensor launch for every norm, accumulated and returned in fp32.
    const at::Tensor norms = at::stack(at::_foreach_norm(grads, 2, at::kFloat));
    return std::sqrt(norms.pow(2).sum().item<double>());
  }
#endif
  at::Tensor total;
  for (const at::Tensor& g : grads) {
    const at::Tensor sq = g.to(at::kFloat).pow(2).sum();
    total = total.defined() ? total + sq : sq;
  }
  return std::sqrt(total.item<double>());
}

double clip_factor(double grad_norm, double max_norm) {
  return max_norm > 0 && grad_norm > max_norm ? max_norm / (grad_norm + 1e-6) : 1.0;
}

}  // namespace dflash::train
