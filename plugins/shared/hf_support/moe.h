// The Mixture-of-Experts MLP of the Qwen MoE families, frozen (forward only):
//   qwen3_moe    (Qwen3-30B-A3B, Qwen3-235B-A22B): softmax over the router's
//                logits in fp32, the top k, renormalised when norm_topk_prob;
//   qwen3_5_moe  (Qwen3.5-397B-A17B, Qwen3.6-35B-A3B): the same, always
//                renormalised, plus a shared expert scaled by
//                sigmoid(shared_expert_gate · x).
// Experts run grouped: the routed (token, expert) pairs are sorted by expert
// and each expert with tokens is one gate_up GEMM, SwiGLU and one down GEMM
// over its contiguous slice; nothing loops over tokens. The arithmetic
// follows transformers': the softmax and renormalisation in fp32, the weights
// rounded to the activations' dtype, each expert's output scaled by its
// weight and summed into the token in expert order.
#pragma once

#include "checkpoint.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace dflash::hf {

struct MoeSpec {
  int64_t experts = 0, top_k = 0, intermediate = 0;  // moe_intermediate_size
  bool normalize = true;                              // renormalise the top k weights
  int64_t shared_intermediate = 0;                    // 0 = no shared expert
};

struct MoeWeights {
  at::Tensor router;   // [E, H]
  at::Tensor gate_up;  // [E, 2I, H]: each expert's [gate; up]
  at::Tensor down;     // [E, H, I]
  // The shared expert (shared_intermediate > 0): [2S, H], [H, S], and its gate [1, H].
  at::Tensor shared_gate_up, shared_down, shared_gate;
};

// Loads `<mlp>gate.weight` and the experts in either on-disk layout: one
// tensor per expert (`<mlp>experts.<e>.{gate,up,down}_proj.weight`, as
// Qwen3-30B-A3B ships) or fused (`<mlp>experts.gate_up_proj` [E, 2I, H] and
// `<mlp>experts.down_proj` [E, H, I], as transformers 5 and Qwen3.5 MoE
// write them); the shared expert under `<mlp>shared_expert.` and
// `<mlp>shared_expert_gate.weight`. A missing expert, or a shape that
// disagrees with config.json, is an error naming the tensor.
MoeWeights load_moe(const Checkpoint& ckpt, const std::string& mlp, const MoeSpec& spec, int64_t hidden,
                    c10::ScalarType dtype, const c10::Device& device);

// Element count of the weights load_moe keeps (the memory planner's figure).
double moe_weight_elements(const MoeSpec& spec, int64_t hidden);

// The block's output for x [N, H] (already normed): Σ_k w_k · expert_k(x)
// (+ the gated shared expert), [N, H] in x's dtype.
at::Tensor moe_forward(const MoeWeights& w, const MoeSpec& spec, const at::Tensor& x);

}  // namespace dflash::hf
