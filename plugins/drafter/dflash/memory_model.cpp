#include "memory_model.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace dflash::drafter {

namespace {

int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

}  // namespace

ResolvedShape resolve_shape(const nlohmann::json& config, const nlohmann::json& target) {
  auto from_target = [&](const char* key) {
    if (!target.contains(key))
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, std::string("the target's description lacks '") + key + "'");
    return target.at(key).get<int64_t>();
  };
  auto own_or_target = [&](const char* own, const char* theirs) {
    const int64_t v = config.at(own).get<int64_t>();
    return v > 0 ? v : from_target(theirs);
  };
  ResolvedShape r;
  DrafterShape& shape = r.shape;
  r.vocab = from_target("vocab_size");
  const int64_t target_layers = from_target("num_layers");
  shape.layers = config.at("num_layers").get<int64_t>();
  shape.hidden = from_target("hidden_size");
  shape.target_hidden = shape.hidden;
  shape.heads = own_or_target("num_attention_heads", "num_attention_heads");
  shape.kv_heads = own_or_target("num_key_value_heads", "num_key_value_heads");
  shape.head_dim = config.at("head_dim").get<int64_t>() > 0 ? config.at("head_dim").get<int64_t>()
                   : target.contains("head_dim")             ? target.at("head_dim").get<int64_t>()
                                                             : shape.hidden / shape.heads;
  shape.intermediate = config.at("intermediate_size").get<int64_t>() > 0
                           ? config.at("intermediate_size").get<int64_t>()
                           : (target.contains("intermediate_size") ? target.at("intermediate_size").get<int64_t>()
                                                                   : 4 * shape.hidden);
  shape.rms_norm_eps = target.value("rms_norm_eps", 1e-6);
  const double theta = config.at("rope_theta").get<double>();
  shape.rope_theta = theta > 0 ? theta : target.value("rope_theta", 1e6);
  if (shape.heads % shape.kv_heads != 0)
    throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "drafter.num_key_value_heads " + std::to_string(shape.kv_heads) +
                                                      " does not divide num_attention_heads " + std::to_string(shape.heads));
  r.target_layers = target_layers;
  r.layer_ids = config.at("target_layer_ids").get<std::vector<int64_t>>();
  if (r.layer_ids.empty()) r.layer_ids = default_target_layer_ids(target_layers, shape.layers);
  for (int64_t id : r.layer_ids)
    if (id >= target_layers)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "drafter.target_layer_ids: " + std::to_string(id) +
                                                        " is not a layer of the target (it has " +
                                                        std::to_string(target_layers) + ")");
  shape.feature_layers = static_cast<int64_t>(r.layer_ids.size());
  r.mask_token = config.at("mask_token_id").get<int64_t>();
  if (r.mask_token < 0) r.mask_token = r.vocab - 1;
  if (r.mask_token >= r.vocab)
    throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "drafter.mask_token_id " + std::to_string(r.mask_token) +
                                                      " is outside the target's vocabulary of " + std::to_string(r.vocab));
  return r;
}

int64_t layer_parameter_count(const DrafterShape& s) {
  const int64_t h = s.hidden, q_out = s.heads * s.head_dim, kv_out = s.kv_heads * s.head_dim;
  return 2 * h + q_out * h + 2 * kv_out * h + h * q_out + 2 * s.head_dim + 3 * s.intermediate * h;
}

int64_t parameter_count(const DrafterShape& s) {
  return s.hidden * s.feature_layers * s.target_hidden + 2 * s.hidden + s.layers * layer_parameter_count(s);
}

sdk::MemoryPlan step_memory(const DrafterShape& s, const StepShape& step) {
  using sdk::MemoryPhase;
  const double e = static_cast<double>(step.element_bytes);
  const double f = step.element_bytes > 4 ? e : 4.0;  // rms_norm's statistics dtype (fp32; fp64 for fp64)
  const double B = static_cast<double>(step.rows), S = static_cast<double>(step.row_length);
  const int64_t slots_per_row = step.anchors * step.block_size;
  const double Q = B * static_cast<double>(slots_per_row);                              // block slots
  const double C = B * S;                                                                // context positions
  const double N = B * static_cast<double>(step.anchors * (step.block_size - 1));        // loss rows
  const double H = static_cast<double>(s.hidden), I = static_cast<double>(s.intermediate);
  const double d = static_cast<double>(s.head_dim);
  const double HQ = static_cast<double>(s.heads) * d, HKV = static_cast<double>(s.kv_heads) * d;
  const double heads = static_cast<double>(s.heads);
  // An rms_norm over [n, D] (HF's arithmetic) saves its fp32 input copy and
  // the normalised, rounded tensor the weight multiplies.
  auto rms = [&](double n, double D) { return (f + e) * n * D; };

  // Attention calls: every group's queries, and the keys it reads (worst
  // case: a group's context range is the whole row).
  double context_keys = 0, score_elements = 0, bias_elements = 0;
  if (step.group_blocks > 0) {
    for (int64_t first = 0; first < step.anchors; first += step.group_blocks) {
      const int64_t queries = std::min(step.group_blocks, step.anchors - first) * step.block_size;
      const int64_t keys = step.row_length + queries;
      context_keys += S;
      score_elements += static_cast<double>(queries) * static_cast<double>(keys);
      bias_elements += static_cast<double>(queries) * static_cast<double>(pad16(keys));
    }
    context_keys *= B, score_elements *= B, bias_elements *= B;
  } else {
    const int64_t keys = step.row_length + slots_per_row;
    context_keys = C;
    score_elements = B * static_cast<double>(slots_per_row) * static_cast<double>(keys);
    bias_elements = B * static_cast<double>(slots_per_row) * static_cast<double>(pad16(keys));
  }
  // No mask: the prefixes run unmasked, the kernel (and its reference) needs none.
  if (step.block_kernel || step.block_reference) bias_elements = 0;
  // K and V as the kernel saves them: per group (or the whole row) for
  // cuDNN, repeated to every query head for SDPA's GQA.
  const double kv_width = (!step.cudnn && s.heads > s.kv_heads) ? HQ : HKV;
  // Grouped attention keeping rows (attention_keeping_rows): the layer's k
  // and v rows, context and slots, once; no call's copies.
  const bool rows_kept = step.keeps_rows && step.group_blocks > 0;

  // One layer, without checkpointing.
  // RoPE multiplies by constant tables, so autograd keeps only the tables;
  // the rotated q is kept by the attention kernel, the rotated k only through
  // the kernel's per-group copies.
  // o_proj reads each attention call's output as a view of it on CUDA (the
  // fused kernels write [n, queries, heads, d]), so autograd keeps one
  // tensor for both; SDPA's math path writes [n, heads, queries, d] and the
  // view becomes a copy.
  // The block reference writes [n, heads, d] rows as the kernels do.
  const double outputs_kept = step.cuda || step.block_reference ? 1.0 : 2.0;
  const double kernel_saves = (rows_kept ? 2 * e * Q * HKV : 2 * e * Q * kv_width)  // the slots' k and v as the kernel keeps them
                              + outputs_kept * e * Q * HQ + 4 * heads * Q            // kernel output (o_proj's input); log-sum-exp
                              + (step.cuda || rows_kept ? 0.0 : e * heads * score_elements + e * Q * HQ);  // SDPA math: probabilities
  const double kv_heads = static_cast<double>(s.kv_heads);
  double attention = 0, context_kv = 0, mlp = 0;
  if (step.fused) {
    // trainable_ops: each norm keeps its input and an fp32 rsqrt per
    // normalised vector; the MLP block keeps y, its rsqrt and gate|up.
    attention = e * Q * H + 4 * Q                          // input norm + q/k/v: x, rsqrt (h is recomputed)
                + e * Q * HQ + 4 * Q * heads + e * Q * HQ  // q before its norm, rsqrt; the rotated q the kernel keeps
                + e * Q * HKV + 4 * Q * kv_heads           // the slots' k before its norm, rsqrt
                + kernel_saves;
    context_kv = e * C * HKV + 4 * C * kv_heads + 2 * e * (rows_kept ? C * HKV : context_keys * kv_width);
    mlp = e * Q * H + 4 * Q + 2 * e * Q * I;
  } else {
    attention = rms(Q, H) + e * Q * H        // input norm; h (read by q, k, v)
                + (f + 2 * e) * Q * HQ       // q: its norm, and the rotated q the kernel keeps
                + (f + e) * Q * HKV          // the slots' k: its norm
                + kernel_saves;
    context_kv = (f + e) * C * HKV                  // the context's k: its norm
                 + 2 * e * (rows_kept ? C * HKV : context_keys * kv_width);  // its k and v as the kernel keeps them
    mlp = rms(Q, H) + e * Q * H + 4 * e * Q * I;    // post norm; m; gate, silu, up, product
  }
  const double layer_full = attention + context_kv + mlp;

  sdk::MemoryPlan plan;
  // A norm outside the layers (the context's, the final one).
  auto outer_norm = [&](double n, double D) { return step.fused ? e * n * D + 4 * n : rms(n, D); };
  plan.add("drafter context: fc input, fc + norm", e * C * static_cast<double>(s.feature_layers * s.target_hidden) +
                                                       outer_norm(C, H) + e * C * H,
           MemoryPhase::kActivations);
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string layer = "drafter layer " + std::to_string(i) + ": ";
    if (step.checkpointing) {
      plan.add(layer + "input (checkpointed)", e * Q * H, MemoryPhase::kActivations);
    } else {
      plan.add(layer + "attention", attention, MemoryPhase::kActivations);
      plan.add(layer + "context K/V projections", context_kv, MemoryPhase::kActivations);
      plan.add(layer + "MLP", mlp, MemoryPhase::kActivations);
    }
  }
  plan.add("attention workspace: masks, rotary tables", e * bias_elements + 2 * e * (Q + C + Q) * d,
           MemoryPhase::kActivations);
  plan.add("final norm and the loss's inputs", outer_norm(Q, H) + e * N * H + 20 * N + (step.teacher ? e * N * H : 0.0),
           MemoryPhase::kActivations);
  // Backward: the peak comes in the first layer it reaches (the last one),
  // while every activation is still alive: in its MLP, the product's and
  // silu's gradients [Q, I] beside the hidden-state gradient and the down
  // projection's weight gradient (the product itself is freed as they come).
  // Fused: the MLP block's backward holds the recomputed product's gradient
  // [Q, I] and gate|up's [Q, 2I] beside the incoming gradient and the down
  // projection's weight gradient.
  // Off the kernels (trainable_ops runs them on CUDA in bf16/fp16) the fused
  // MLP block's backward is its closed form: the product's gradient, σ,
  // d_up, d_gate and the slope 1 + gate·(1 − σ), in the statistics dtype
  // (and gate, up and the gradient converted to it first, when that differs).
  const bool mlp_kernels = step.cuda && step.element_bytes == 2;
  const double fused_mlp = mlp_kernels ? 3 * e * Q * I : e * Q * I + (f != e ? 3 * f * Q * I : 0.0) + 4 * f * Q * I;
  double layer_backward = step.fused ? fused_mlp + e * H * I + e * Q * H : 2 * e * Q * I + e * H * I + e * Q * H;
  if (step.block_reference) {
    // The block reference's backward (grouped_attention.cpp) takes its parts
    // one at a time: a group's prefix call (its queries against the context
    // before the group's first anchor: at most the row) or a 16-row entry.
    // Each holds its scores, probabilities, dP, dP − δ and dS at once, in
    // fp32 (fp64 for fp64), beside dq, dk, dv and the incoming gradient.
    const double queries = static_cast<double>(std::min(step.group_blocks, step.anchors) * step.block_size);
    const double part = std::max(queries * S, 16.0 * (S + static_cast<double>(step.block_size)));
    const double attention_backward = 5 * f * heads * part + 2 * e * Q * HQ + 2 * e * (Q + C) * HKV;
    layer_backward = std::max(layer_backward, attention_backward);
  }
  if (step.checkpointing) {
    // The layer runs again with grad, then its backward returns every
    // gradient of the layer at once: its weights', x's and the context's,
    // beside the incoming gradient.
    plan.add("backward: one layer recomputed", layer_full, MemoryPhase::kBackward);
    plan.add("backward working memory (one layer's gradients)",
             layer_backward + e * static_cast<double>(layer_parameter_count(s)) + e * Q * H + e * C * H,
             MemoryPhase::kBackward);
  } else {
    plan.add("backward working memory (largest layer)", layer_backward, MemoryPhase::kBackward);
  }
  return plan;
}

}  // namespace dflash::drafter
