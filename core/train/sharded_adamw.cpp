#include "train/sharded_adamw.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>
#include <numeric>

namespace dflash::train {

std::vector<int> shard_by_size(const std::vector<int64_t>& numels, int world_size) {
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int> owner(numels.size(), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    owner[i] = static_cast<int>(least - load.begin());
    *least += numels[i];
  }
  return owner;
}

ShardedAdamW::ShardedAdamW(host::NamedTensors parameters, const AdamWOptions& options, dist::Collective& group)
    : parameters_(std::move(parameters)), options_(options), group_(group) {
  std::vector<int64_t> numels;
  for (const auto& [name, p] : parameters_) numels.push_back(p.numel());
  owner_ = shard_by_size(numels, group_.world_size());
  host::NamedTensors mine;
  for (size_t i = 0; i < parameters_.size(); ++i)
    if (owner_[i] == group_.rank()) mine.push_back(parameters_[i]);
  local_ = std::make_unique<AdamW>(mine, options_);
}

void ShardedAdamW::step(double lr, double grad_factor) {
  local_->step(lr, grad_factor);
  // Every rank's share, to every rank: one flat broadcast per owner.
  const c10::NoGradGuard no_grad;
  for (int r = 0; r < group_.world_size(); ++r) {
    std::vector<at::Tensor> share;
    for (size_t i = 0; i < parameters_.size(); ++i)
      if (owner_[i] == r) share.push_back(parameters_[i].second.detach());
    if (share.empty()) continue;
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& t : share) flat_parts.push_back(t.reshape({-1}).to(share.front().scalar_type()));
    at::Tensor flat = at::cat(flat_parts);
    group_.broadcast(flat, r, "the updated parameters of rank " + std::to_string(r));
    if (r == group_.rank()) continue;
    int64_t offset = 0;
    for (at::Tensor& t : share) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

void ShardedAdamW::zero_grad() {
  for (auto& [name, p] : parameters_)
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

host::NamedTensors ShardedAdamW::state() {
  // Each owner broadcasts the states of its tensors, tensor by tensor (a
  // checkpoint's pace, not a step's), in the drafter's order.
  const c10::NoGradGuard no_grad;
  const host::NamedTensors own = local_->state();
  std::map<std::string, at::Tensor> by_name(own.begin(), own.end());
  host::NamedTensors whole;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& [name, p] = parameters_[i];
    std::vector<std::string> names{"exp_avg." + name, "exp_avg_sq." + name};
    if (options_.fp32_master) names.push_back("master." + name);
    for (const std::string& state_name : names) {
      at::Tensor t = owner_[i] == group_.rank()
                         ? by_name.at(state_name).clone()
                         : at::empty(p.sizes(), p.options().dtype(options_.fp32_master ? at::kFloat : p.scalar_type()));
      group_.broadcast(t, owner_[i], "the optimizer state of " + name);
      whole.emplace_back(state_name, t);
    }
  }
  whole.emplace_back("step", by_name.at("step"));
  return whole;
}

}  // namespace dflash::train
