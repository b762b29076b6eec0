#include "moe.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace dflash::hf {

MoeWeights load_moe(const Checkpoint& ckpt, const std::string& mlp, const MoeSpec& spec, int64_t h,
                    c10::ScalarType dtype, const c10::Device& device) {
  const int64_t e = spec.experts, inter = spec.intermediate;
  MoeWeights w;
  w.router = ckpt.get(mlp + "gate.weight", {e, h}, dtype, device);
  if (ckpt.has(mlp + "experts.gate_up_proj")) {
    w.gate_up = ckpt.get(mlp + "experts.gate_up_proj", {e, 2 * inter, h}, dtype, device);
    w.down = ckpt.get(mlp + "experts.down_proj", {e, h, inter}, dtype, device);
  } else {
    if (!ckpt.has(mlp + "experts.0.gate_proj.weight"))
      throw std::runtime_error(ckpt.directory().string() + ": tensor '" + mlp +
                               "experts.0.gate_proj.weight' is missing (nor are the experts stored fused as '" + mlp +
                               "experts.gate_up_proj'); config.json says num_experts " + std::to_string(e));
    w.gate_up = at::empty({e, 2 * inter, h}, at::TensorOptions().dtype(dtype).device(device));
    w.down = at::empty({e, h, inter}, at::TensorOptions().dtype(dtype).device(device));
    for (int64_t i = 0; i < e; ++i) {
      const std::string p = mlp + "experts." + std::to_string(i) + ".";
      w.gate_up[i].narrow(0, 0, inter).copy_(ckpt.get(p + "gate_proj.weight", {inter, h}, dtype, device));
      w.gate_up[i].narrow(0, inter, inter).copy_(ckpt.get(p + "up_proj.weight", {inter, h}, dtype, device));
      w.down[i].copy_(ckpt.get(p + "down_proj.weight", {h, inter}, dtype, device));
    }
    if (ckpt.has(mlp + "experts." + std::to_string(e) + ".gate_proj.weight"))
      throw std::runtime_error(ckpt.directory().string() + ": tensor '" + mlp + "experts." + std::to_string(e) +
                               ".gate_proj.weight' exists, but config.json says num_experts " + std::to_string(e));
  }
  if (spec.shared_intermediate > 0) {
    const int64_t s = spec.shared_intermediate;
    const std::string p = mlp + "shared_expert.";
    w.shared_gate_up = at::cat({ckpt.get(p + "gate_proj.weight", {s, h}, dtype, device),
                                ckpt.get(p + "up_proj.weight", {s, h}, dtype, device)});
    w.shared_down = ckpt.get(p + "down_proj.weight", {h, s}, dtype, device);
    w.shared_gate = ckpt.get(mlp + "shared_expert_gate.weight", {1, h}, dtype, device);
  }
  return w;
}

double moe_weight_elements(const MoeSpec& spec, int64_t hidden) {
  const double h = static_cast<double>(hidden), e = static_cast<double>(spec.experts);
  const double inter = static_cast<double>(spec.intermediate), s = static_cast<double>(spec.shared_intermediate);
  double n = e * h + e * 3 * inter * h;
  if (spec.shared_intermediate > 0) n += 3 * s * h + h;
  return n;
}

namespace {

at::Tensor swiglu(const at::Tensor& gate_up) {
  const int64_t inter = gate_up.size(-1) / 2;
  return at::silu(gate_up.narrow(-1, 0, inter)) * gate_up.narrow(-1, inter, inter);
}

}  // namespace

at::Tensor moe_forward(const MoeWeights& w, const MoeSpec& spec, const at::Tensor& x) {
  const int64_t n = x.size(0), h = x.size(1), k = spec.top_k;
  at::Tensor out = at::zeros_like(x);
  if (n > 0) {
    // Routing in fp32, as transformers: softmax, top k, renormalised.
    const at::Tensor probabilities = at::softmax(at::linear(x, w.router), -1, at::kFloat);  // [N, E]
    auto [weights, experts] = probabilities.topk(k, -1);                                    // [N, k]
    if (spec.normalize) weights = weights / weights.sum(-1, true);
    weights = weights.to(x.scalar_type());  // transformers casts them back to the activations' dtype
    // The (token, expert) pairs sorted by expert: each expert's tokens are
    // one contiguous slice. A stable sort keeps tokens in order within one.
    const at::Tensor flat = experts.reshape({n * k});
    const at::Tensor order = std::get<1>(flat.sort(/*stable=*/true, 0, false));
    const at::Tensor token = order.div(k, "floor");
    const at::Tensor pair_weight = weights.reshape({n * k}).index_select(0, order).unsqueeze(1);
    // One host read: how many tokens each expert has (the slices' bounds).
    const at::Tensor counts = at::bincount(flat, {}, spec.experts).to(at::kCPU);
    const int64_t* count = counts.data_ptr<int64_t>();
    at::Tensor expert_out;  // [N·k, H], in the sorted pairs' order
    {
      const at::Tensor routed = x.index_select(0, token);  // [N·k, H]
      expert_out = at::empty_like(routed);
      int64_t offset = 0;
      for (int64_t e = 0; e < spec.experts; ++e) {
        if (count[e] == 0) continue;
        const at::Tensor slice = routed.narrow(0, offset, count[e]);
        expert_out.narrow(0, offset, count[e]).copy_(at::linear(swiglu(at::linear(slice, w.gate_up[e])), w.down[e]));
        offset += count[e];
      }
    }
    expert_out.mul_(pair_weight);  // rounded to x's dtype, as transformers' product
    // Each token's k outputs summed in expert order, rounding after each add,
    // as transformers' index_add_ per expert does. One index_add_ over every
    // pair would give that on the CPU only: on CUDA it adds a token's k rows
    // with atomics, in no fixed order (bf16 results would change run to run).
    // So each output goes to row `token·k + its expert's rank among the
    // token's k`, written once (deterministic), and the k rows are added in turn.
    const at::Tensor by_expert = std::get<1>(experts.sort(/*stable=*/true, -1, false));  // [N, k] slots
    const at::Tensor rank = at::empty_like(by_expert).scatter_(1, by_expert, at::arange(k, by_expert.options()).expand({n, k}));
    const at::Tensor row = token * k + rank.reshape({n * k}).index_select(0, order);
    const at::Tensor ordered = at::empty_like(expert_out).index_copy_(0, row, expert_out).view({n, k, h});
    out.copy_(ordered.select(1, 0));
    for (int64_t j = 1; j < k; ++j) out.add_(ordered.select(1, j));
  }
  if (w.shared_gate_up.defined()) {
    const at::Tensor shared = at::linear(swiglu(at::linear(x, w.shared_gate_up)), w.shared_down);
    out.add_(at::sigmoid(at::linear(x, w.shared_gate)) * shared);
  }
  return out;
}

}  // namespace dflash::hf
