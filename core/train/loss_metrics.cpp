#include "train/loss_metrics.h"

#include <set>
#include <sstream>

#include "log/log.h"
#include "plugin/host_api.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <sstream>
#include <stdexcept>
#include <vector>

namespace dflash::train {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// argmax(h·Wᵀ) == target per row, 1024 rows at a time: no [N, V] tensor.
at::Tensor top1_by_chunks(const host::LossCall& call) {
  const c10::NoGradGuard no_grad;
  const int64_t n = call.hidden.size(0);
  at::Tensor hits = at::empty({n}, call.hidden.options().dtype(at::kFloat));
  const at::Tensor weight_t = call.lm_head_weight.detach().t();
  for (int64_t start = 0; start < n; start += 1024) {
    const int64_t rows = std::min<int64_t>(1024, n - start);
    const at::Tensor z = at::matmul(call.hidden.detach().narrow(0, start, rows), weight_t);
    hits.narrow(0, start, rows).copy_(z.argmax(1).eq(call.targets.narrow(0, start, rows)));
  }
  return hits;
}

}  // namespace

at::Tensor LossMetrics::top1_hits(const host::LossCall& call, const host::LossOutput& out) {
  const at::Tensor reported = host::find_tensor(out.metrics, "accuracy");
  const int64_t n = call.hidden.size(0);
  if (!reported.defined()) {
    if (!warned_) {
      log::warn("loss plugin '" + plugin_ + "' reports no per-row 'accuracy', so the host computes the top-1 hits "
                "itself (argmax of hidden·lm_headᵀ, one more [N, H]×[H, V] GEMM a step, in chunks of 1024 rows). "
                "Report 'accuracy' [N] from the logits the loss already has, or build it on the SDK's chunked-loss "
                "toolkit (dflash/sdk/chunked_loss.hpp), which does");
      warned_ = true;
    }
    return top1_by_chunks(call);
  }
  if (reported.dim() != 1 || reported.size(0) != n)
    throw std::runtime_error("loss plugin '" + plugin_ + "' returned metric 'accuracy' of shape " + shape_of(reported) +
                             "; 'accuracy' is reserved for the per-row top-1 hits [N] = [" + std::to_string(n) +
                             "] (argmax of the logits == target) that slot accuracy and τ are built on. "
                             "Return it per row, or under another name");
  // Checked on the host copy the slot tally reads anyway: one device read, not two.
  const at::Tensor hits = reported.detach().to(at::kCPU, at::kDouble);
  if (hits.ne(0).logical_and(hits.ne(1)).any().item<bool>())
    throw std::runtime_error("loss plugin '" + plugin_ + "' returned metric 'accuracy' with values other than 0 and 1; "
                             "'accuracy' is reserved for the per-row top-1 hits (argmax of the logits == target). "
                             "Return other scores under another name");
  return hits;
}

void LossMetrics::add(const host::LossCall& call, const host::LossOutput& out) {
  const c10::NoGradGuard no_grad;
  const int64_t n = call.hidden.size(0);
  const at::Tensor valid = call.targets.ne(call.ignore_index).to(at::kDouble);
  const at::Tensor weight = call.row_weights.defined() ? valid * call.row_weights.detach().to(at::kDouble) : valid;
  const at::Tensor total_weight = weight.sum();
  for (const auto& [name, metric] : out.metrics) {
    // Numbers only (floating, integral or boolean); anything else has no mean.
    if (!metric.defined() || !(at::isFloatingType(metric.scalar_type()) ||
                               at::isIntegralType(metric.scalar_type(), /*includeBool=*/true)))
      continue;
    const at::Tensor value = metric.detach().to(call.hidden.device(), at::kDouble);
    Sum add;
    if (value.dim() == 1 && value.size(0) == n) {
      add = {(value * weight).sum(), total_weight};
    } else if (value.dim() == 0) {
      add = {value, at::ones({}, value.options())};
    } else {
      continue;  // neither per row nor a scalar: nothing to reduce it to
    }
    auto [it, fresh] = sums_.try_emplace(name, add);
    if (!fresh) {
      it->second.numerator = it->second.numerator + add.numerator;
      it->second.denominator = it->second.denominator + add.denominator;
    }
  }
}

nlohmann::json LossMetrics::take(dist::Collective* ranks) {
  nlohmann::json figures = nlohmann::json::object();
  std::vector<std::string> names;
  for (const auto& [name, sum] : sums_) names.push_back(name);
  if (ranks != nullptr && ranks->world_size() > 1) {
    // Every rank reduces the same names in the same order: the union of theirs.
    std::string mine;
    for (const std::string& name : names) mine += name + '\n';
    std::set<std::string> all;
    for (const std::string& text : ranks->all_gather_text(mine, "the loss metrics' names")) {
      std::stringstream lines(text);
      for (std::string name; std::getline(lines, name);) all.insert(name);
    }
    names.assign(all.begin(), all.end());
  }
  if (names.empty()) return {{plugin_, figures}};
  std::vector<at::Tensor> parts;
  for (const std::string& name : names) {
    const auto it = sums_.find(name);
    if (it == sums_.end()) {
      parts.push_back(at::zeros({2}, at::kDouble));
      continue;
    }
    parts.push_back(it->second.numerator.reshape({1}).to(at::kCPU));
    parts.push_back(it->second.denominator.reshape({1}).to(at::kCPU));
  }
  at::Tensor values = at::cat(parts);
  if (ranks != nullptr && ranks->world_size() > 1) ranks->all_reduce_sum(values, "the loss metrics");
  const double* v = values.data_ptr<double>();
  size_t i = 0;
  for (const std::string& name : names) {
    const double numerator = v[i++], denominator = v[i++];
    // No supervised row this step: the weighted mean is undefined, logged as null.
    figures[name] = denominator > 0 ? nlohmann::json(numerator / denominator) : nlohmann::json(nullptr);
  }
  sums_.clear();
  return {{plugin_, figures}};
}

}  // namespace dflash::train
