// What the in-tree loss plugins share beyond the SDK's chunked-loss toolkit
// (<dflash/sdk/chunked_loss.hpp>, which chunks, reduces, differentiates and
// checks for all of them): the settings of the CE + KL blend and its
// per-chunk mathematics. Built into each loss plugin (static).
//
//   ℓ_i = (1 − α)·CE_i + α·T²·KL_i(teacher_T ‖ student_T), α = kl_weight,
//   T = temperature (CE always at temperature 1, as in Hinton et al.).
#pragma once

#include <dflash/sdk/chunked_loss.hpp>

#include <functional>

namespace dflash::loss {

struct BlendSettings {
  double kl_weight;    // α
  double temperature;  // T
  static BlendSettings read(const nlohmann::json& config);
  // The teacher signal the blend reads: `kind` when α > 0, none for CE only.
  sdk::Teacher teacher(sdk::Teacher kind) const { return kl_weight > 0 ? kind : sdk::Teacher::kNone; }
};

// Adds kl_weight (default `default_kl_weight`) and temperature, so every
// blend spells them the same way.
sdk::Schema& add_distillation(sdk::Schema& schema, double default_kl_weight);

// The KL term of a blend on one chunk: per-row KL and, when the chunk wants
// a gradient, T·∂KL/∂z [r, V] in a buffer of the term's own (the blend
// scales it in place by α·T·c, making α·T²·∂KL/∂z row by row).
struct KlTerm {
  at::Tensor rows, t_grad;
};
using KlTermFn = std::function<KlTerm(const sdk::LossChunk&)>;

// The full-vocabulary KL(softmax(u/T) ‖ softmax(z/T)): T·∂KL/∂z = softmax(z/T) − softmax(u/T).
KlTerm full_kl_term(const sdk::LossChunk& chunk, double temperature);

// The blend on one chunk with its gradient in closed form, by LibTorch
// operators in the logits' dtype (any device): per-row losses, the metrics
// "ce" (and "kl"), the top-1 hits and, when chunk.need_grad,
//   ∂(Σ c·ℓ)/∂z = c·[(1 − α)·(softmax(z) − onehot(y)) + α·T·(T·∂KL/∂z)].
// `kl_term` (read when α > 0) is the full-vocabulary KL unless given (topk_kl
// gives its bucket KL). The one implementation of the blend's mathematics:
// ce (α = 0), kl, topk_kl, and fused_ckpt_kl off its CUDA kernels.
sdk::ChunkRows blend_rows_and_grad(const sdk::LossChunk& chunk, const BlendSettings& s, const KlTermFn& kl_term = {});

// The blend's rows from per-row CE and KL (undefined when α = 0), with the
// per-row metrics "ce" (and "kl").
sdk::ChunkRows blend_rows(const BlendSettings& s, const at::Tensor& ce, const at::Tensor& kl);

// Bytes per logit of `buffers` math-dtype [chunk, V] buffers alive at once:
// what a loss declares as its logit_bytes(), measured by
// tests/plugins/loss/loss_memory_test.cpp (which fails when a loss uses more).
inline double math_buffers(const sdk::LossShape& shape, double buffers) {
  return buffers * (shape.element_bytes >= 8 ? 8.0 : 4.0);
}

}  // namespace dflash::loss
