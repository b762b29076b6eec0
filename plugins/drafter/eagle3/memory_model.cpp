#include "memory_model.h"

#include "ttt_attention.h"

#include <algorithm>
#include <string>

namespace dflash::eagle3 {

using sdk::MemoryPhase;

int64_t parameter_count(const Eagle3Shape& s) {
  const int64_t q_width = s.heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  return s.hidden * s.feature_layers * s.target_hidden            // fc
         + 4 * s.hidden                                           // hidden_norm, input_layernorm, post norm, norm
         + 2 * s.hidden * (q_width + 2 * kv_width) + q_width * s.hidden  // q, k, v over 2H; o
         + 3 * s.hidden * s.intermediate                          // gate, up, down
         + s.draft_vocab * s.hidden;                              // lm_head
}

int64_t loss_rows(const Eagle3StepShape& step) { return step.steps * step.rows * step.row_length; }

sdk::MemoryPlan step_memory(const Eagle3Shape& s, const Eagle3StepShape& step) {
  const double e = static_cast<double>(step.element_bytes), f = 4;  // fp32 statistics
  const double T = static_cast<double>(step.rows * step.row_length), K = static_cast<double>(step.steps);
  const double H = static_cast<double>(s.hidden), Ht = static_cast<double>(s.target_hidden);
  const double Q = static_cast<double>(s.heads * s.head_dim), KV = static_cast<double>(s.kv_heads * s.head_dim);
  const double I = static_cast<double>(s.intermediate), d = static_cast<double>(s.head_dim);
  const double heads = static_cast<double>(s.heads), R = static_cast<double>(loss_rows(step));
  const bool kernels = step.cuda && step.element_bytes == 2;   // trainable_ops' CUDA kernels
  const bool flash = kernels && s.flash_attention && s.head_dim % 8 == 0 && s.head_dim <= 256;

  // One TTT step. The fused norms keep their input (counted where it is
  // made) and an fp32 rsqrt per row; the op-by-op ones an fp32 copy of x and
  // the normalised tensor besides. q, k and v read one [T, 2H] concatenation.
  // RoPE multiplies by constant tables, so autograd keeps the tables (cos and
  // sin for q and for k) and the rotated q and k, which the attention keeps;
  // v is the projection's output itself. The attention's output is o_proj's
  // input as a view (both write [T, heads, d]). Flash keeps its
  // log-sum-exp twice (by token, and in flash's own layout for its backward);
  // the chunked form once.
  // Per op-by-op norm: the normalised tensor, and x's fp32 copy unless x is fp32 already.
  const double norm_extra = s.fused_ops ? 0.0 : (e == f ? 0.0 : f * T * H) + e * T * H;
  const double attention = e * T * 2 * H                   // the concatenated, normalised inputs
                           + 4 * e * T * d                 // rotary tables for q and k
                           + e * T * (Q + 2 * KV)          // rotated q and k, v
                           + e * T * Q                     // the attention's output
                           + (flash ? 2.0 : 1.0) * f * T * heads;  // log-sum-exp
  const double mlp = s.fused_ops ? e * T * H + 2 * e * T * I                // y (out + residual); gate|up
                                 : e * T * H + e * T * H + 4 * e * T * I;  // y; m; gate, silu, up, product
  const double norms = 3 * f * T + 3 * norm_extra;
  const double step_output = e * T * H;  // the next step's input (and the stack's source)

  sdk::MemoryPlan plan;
  plan.add("drafter inputs: the features (fc's input), fc's output, every step's embeddings",
           e * T * 3 * Ht + e * T * H + e * K * T * H, MemoryPhase::kActivations);
  for (int64_t k = 0; k < step.steps; ++k) {
    const std::string name = "TTT step " + std::to_string(k) + ": ";
    plan.add(name + "norms and attention", norms + attention, MemoryPhase::kActivations);
    plan.add(name + "MLP and output", mlp + step_output, MemoryPhase::kActivations);
  }
  // The loss's rows: gathered from the stacked outputs, the final norm's
  // input and output, the teacher's rows, targets, weights and slots.
  plan.add("final norm and the loss's inputs",
           2 * e * R * H + f * R + (s.fused_ops ? 0.0 : (e == f ? 0.0 : f * R * H) + e * R * H) +
               (step.teacher ? e * R * Ht : 0.0) + 20 * R,
           MemoryPhase::kActivations);
  // On top of those: at the forward's end the steps' outputs stacked
  // [K, T, H] beside the gathered rows; in the backward, the last step's MLP
  // (the recomputed product, its gradient and gate|up's, as the dflash
  // drafter's fused MLP: 3 [T, I] on the kernels, more in the closed form),
  // or its attention's backward (flash: the fp32 own-key terms, q, the key
  // and value read per query head, the gradient, dq; chunked: below),
  // beside the incoming gradient and the hidden state's accumulating one.
  // The larger counts.
  const double stacked = e * K * T * H;
  const double mlp_backward = kernels ? 3 * e * T * I : e * T * I + 4 * f * T * I + (f != e ? 3 * f * T * I : 0.0);
  // The chunked form's backward (ttt_attention.cpp) holds a chunk's fp32
  // scores, probabilities, dP and dS with one temporary (5 of [B, heads, c,
  // S] at the last chunk), beside every input's gradient in fp32 (q, step
  // 0's k and v, the own keys and values of up to K − 1 steps).
  const double chunk = static_cast<double>(ttt_attention_chunk_rows(step.rows, s.heads, step.row_length, kTttScoreBytes));
  const double B = static_cast<double>(step.rows), S = static_cast<double>(step.row_length);
  const double chunked_backward = 5 * f * B * heads * chunk * S + f * T * (Q + 2 * KV + 2 * (K - 1) * KV);
  const double attention_backward = (flash ? 5 * f * T * Q : chunked_backward) + 2 * e * T * (Q + 2 * KV);
  // The attention's backward comes after the MLP's, whose saved tensors
  // are freed by then.
  plan.add("backward working memory (the last step's largest part, or the forward's stacked outputs)",
           std::max(stacked, std::max(mlp_backward, attention_backward - mlp) + e * H * I + 2 * e * T * H),
           MemoryPhase::kBackward);
  return plan;
}

}  // namespace dflash::eagle3
