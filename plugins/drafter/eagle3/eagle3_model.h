#pragma once
// The EAGLE-3 drafter (Li et al., "EAGLE-3", 2025; the layer SpecForge,
// vLLM and SGLang share): fc projects the concatenated hidden states of
// three target layers to the drafter's width; one Llama decoder layer whose
// attention reads [input_layernorm(embedding), hidden_norm(hidden)] (2H wide);
// its own final norm and a head over a draft vocabulary. Parameter names are
// the ones vLLM and SGLang load (midlayer.*, fc, norm, lm_head).
//
// Training unrolls `steps` of drafting (ttt_layout.h): step 0 reads fc(the
// target's features), step k > 0 the layer's own output of step k − 1 at the
// same position. A query at step k attends to the step-0 keys of its
// document up to its position (causal) and to its own position's keys of
// steps 1 … k: what it would see while drafting k tokens ahead.
#include "ttt_layout.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dflash::eagle3 {

struct Eagle3Shape {
  int64_t hidden = 0;         // H, the drafter's width
  int64_t target_hidden = 0;  // H_t, each target layer's width
  int64_t feature_layers = 3;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t intermediate = 0;
  int64_t draft_vocab = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  // layer_ops: fused runs the norms and the MLP as trainable_ops' autograd
  // functions (they save x and a per-row rsqrt, and the MLP recomputes its
  // product in backward); aten runs them op by op, the reference.
  bool fused_ops = true;
  // attention_kernel: auto runs the TTT attention by flash attention where
  // it takes the inputs (ttt_flash_attention.h: CUDA bf16/fp16), the
  // chunked ATen form elsewhere; chunked always runs the latter.
  bool flash_attention = true;
};

class Eagle3Model {
 public:
  // Initialised as transformers initialises a Llama (normal, σ 0.02; norms 1)
  // from `seed`, in options' dtype and device; every tensor requires grad.
  Eagle3Model(const Eagle3Shape& shape, const c10::TensorOptions& options, uint64_t seed);

  // The trainable tensors under the names vLLM and SGLang load.
  std::vector<std::pair<std::string, at::Tensor>> parameters() const;
  const Eagle3Shape& shape() const { return shape_; }
  const at::Tensor& lm_head() const { return lm_head_; }

  // The unrolled steps. features [B, S, feature_layers·H_t]; embeddings
  // [steps, B, S, H] (the embedding of layout.tokens); documents [B, S].
  // Returns each step's output before the final norm, [steps, B, S, H].
  at::Tensor forward_ttt(const at::Tensor& features, const at::Tensor& embeddings, const TttLayout& layout,
                         const at::Tensor& documents) const;
  // The final norm, before lm_head.
  at::Tensor final_norm(const at::Tensor& hidden) const;

  // Drafting, one sequence at a time. fc over a position's target features
  // [n, feature_layers·H_t] → [n, H].
  at::Tensor project(const at::Tensor& features) const;
  // The head's scores over the draft vocabulary, [n, V_d].
  at::Tensor draft_logits(const at::Tensor& hidden) const;
  // The layer over n new positions: embeddings and hidden [n, H] (fc'd
  // features, or the layer's own outputs while drafting ahead), positions
  // [n]. Each sees every cached key (keys, values: [kv_heads, m, d], rotated)
  // and the new ones up to itself. Returns the outputs before the final
  // norm [n, H] and the new positions' keys and values.
  struct Pass {
    at::Tensor out, keys, values;
  };
  Pass extend(const at::Tensor& embeddings, const at::Tensor& hidden, const at::Tensor& positions, const at::Tensor& keys,
              const at::Tensor& values) const;

 private:
  // What the attention reads: [input_layernorm(embeddings), hidden_norm(hidden)], 2H wide.
  at::Tensor layer_input(const at::Tensor& embeddings, const at::Tensor& hidden) const;
  // RMSNorm with `weight`, by trainable_ops or op by op (shape_.fused_ops).
  at::Tensor norm(const at::Tensor& x, const at::Tensor& weight) const;
  // The rest of the layer: the residual around o_proj(attention), then the
  // post-attention norm and MLP with their residual.
  at::Tensor layer_output(const at::Tensor& hidden, const at::Tensor& attention) const;

  Eagle3Shape shape_;
  at::Tensor fc_, hidden_norm_, input_norm_, q_, k_, v_, o_, post_norm_, gate_, up_, down_, norm_, lm_head_;
};

}  // namespace dflash::eagle3
