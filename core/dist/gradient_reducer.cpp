#include "dist/gradient_reducer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace dflash::dist {

GradientReducer::GradientReducer(const host::NamedTensors& parameters, Collective& group, c10::ScalarType reduce_dtype,
                                 int64_t bucket_bytes)
    : group_(group) {
  // Frozen tensors get no gradient, and no bucket.
  for (const auto& [name, tensor] : parameters)
    if (tensor.requires_grad()) parameters_.push_back(tensor);
  if (parameters_.empty()) return;
  where_.resize(parameters_.size());
  seen_.assign(parameters_.size(), false);
  touched_.assign(parameters_.size(), false);
  // Reverse order: the last layers' gradients come first in a backward.
  const int64_t element_bytes = static_cast<int64_t>(c10::elementSize(reduce_dtype));
  std::vector<std::vector<Slot>> layout(1);
  int64_t used = 0;
  for (size_t i = parameters_.size(); i-- > 0;) {
    const int64_t numel = parameters_[i].numel();
    if (!layout.back().empty() && (used + numel) * element_bytes > bucket_bytes) {
      layout.emplace_back();
      used = 0;
    }
    layout.back().push_back(Slot{i, used, numel});
    used += numel;
  }
  for (auto& slots : layout) {
    if (slots.empty()) continue;
    Bucket b;
    const int64_t total = slots.back().offset + slots.back().numel;
    b.flat = at::zeros({total}, parameters_.front().options().dtype(reduce_dtype).requires_grad(false));
    b.slots = std::move(slots);
    for (size_t s = 0; s < b.slots.size(); ++s) where_[b.slots[s].parameter] = {buckets_.size(), s};
    buckets_.push_back(std::move(b));
  }
  has_gradient_ = at::zeros({static_cast<int64_t>(parameters_.size())},
                            parameters_.front().options().dtype(at::kFloat).requires_grad(false));
  for (size_t i = 0; i < parameters_.size(); ++i)
    hook_ids_.push_back(parameters_[i].register_hook([this, i](const at::Tensor& grad) { on_gradient(i, grad); }));
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < hook_ids_.size(); ++i) parameters_[i].remove_hook(hook_ids_[i]);
}

void GradientReducer::arm(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  step_ = step;
  next_launch_ = 0;
  seen_.assign(parameters_.size(), false);
  touched_.assign(parameters_.size(), false);
  for (Bucket& b : buckets_) {
    b.filled = 0;
    b.pending.reset();
  }
}

// The hook runs before autograd adds `incoming` into .grad: the final
// gradient of the step is what .grad holds from the earlier micro-batches
// plus `incoming` — the same sum AccumulateGrad then forms.
void GradientReducer::on_gradient(size_t parameter, const at::Tensor& incoming) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_ || seen_[parameter]) return;
  seen_[parameter] = true;
  touched_[parameter] = true;
  const auto [bucket, slot] = where_[parameter];
  Bucket& b = buckets_[bucket];
  const Slot& s = b.slots[slot];
  const c10::NoGradGuard no_grad;
  const at::Tensor& held = parameters_[parameter].grad();
  at::Tensor view = b.flat.narrow(0, s.offset, s.numel);
  if (held.defined()) view.copy_((held + incoming).reshape({-1}));
  else view.copy_(incoming.reshape({-1}));
  ++b.filled;
  launch_ready();
}

void GradientReducer::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].filled == buckets_[next_launch_].slots.size())
    launch(next_launch_++);
}

void GradientReducer::launch(size_t bucket) {
  buckets_[bucket].pending =
      group_.all_reduce_sum_async(buckets_[bucket].flat, "gradient bucket " + std::to_string(bucket + 1) + " of " +
                                                             std::to_string(buckets_.size()) + ", step " + std::to_string(step_));
}

void GradientReducer::finish() {
  if (parameters_.empty()) return;
  const c10::NoGradGuard no_grad;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
    // Parameters whose hook did not fire: what .grad holds (an earlier
    // micro-batch's), or zeros.
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (seen_[i]) continue;
      seen_[i] = true;
      const auto [bucket, slot] = where_[i];
      Bucket& b = buckets_[bucket];
      const Slot& s = b.slots[slot];
      at::Tensor view = b.flat.narrow(0, s.offset, s.numel);
      const at::Tensor& held = parameters_[i].grad();
      if (held.defined()) view.copy_(held.reshape({-1}));
      else view.zero_();
      ++b.filled;
    }
    launch_ready();
  }
  // Which parameters some rank has a gradient for: one that none has stays
  // without (AdamW leaves it alone), as in a single process.
  std::vector<float> mine(parameters_.size());
  for (size_t i = 0; i < parameters_.size(); ++i) mine[i] = parameters_[i].grad().defined() || touched_[i] ? 1.0f : 0.0f;
  has_gradient_.copy_(at::tensor(mine));
  group_.all_reduce_sum(has_gradient_, "which gradients exist, step " + std::to_string(step_));
  const at::Tensor any = has_gradient_.to(at::kCPU);
  for (Bucket& b : buckets_) {
    b.pending->wait();
    b.pending.reset();
    for (const Slot& s : b.slots) {
      at::Tensor& parameter = parameters_[s.parameter];
      if (any[static_cast<int64_t>(s.parameter)].item<float>() == 0.0f) continue;
      const at::Tensor sum = b.flat.narrow(0, s.offset, s.numel).view(parameter.sizes());
      if (parameter.grad().defined()) parameter.mutable_grad().copy_(sum);
      else parameter.mutable_grad() = sum.to(parameter.dtype()).clone();
    }
  }
}

}  // namespace dflash::dist
