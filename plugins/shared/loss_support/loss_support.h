// What the in-tree loss plugins share beyond the SDK's chunked-loss toolkit
// (<dflash/sdk/chunked_loss.hpp>, which chunks, reduces, differentiates and
// checks for all of them): the settings of the CE + KL blend and its
// per-chunk mathematics. Built into each loss plugin (static).
//
//   ℓ_i = (1 − α)·CE_i + α·T²·KL_i(teacher_T ‖ student_T), α = kl_weight,
//   T = temperature (CE always at temperature 1, as in Hinton et al.).
#pragma once

#include <dflash/sdk/chunked_loss.hpp>

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

// Per-row CE of a chunk: lse(z) − z[y], in the logits' dtype.
at::Tensor ce_rows(const sdk::LossChunk& chunk);

// Per-row KL(softmax(u/T) ‖ softmax(z/T)) of a chunk with teacher logits u.
at::Tensor kl_rows(const sdk::LossChunk& chunk, double temperature);

// The blend's rows from per-row CE and KL (undefined when α = 0), with the
// per-row metrics "ce" (and "kl").
sdk::ChunkRows blend_rows(const BlendSettings& s, const at::Tensor& ce, const at::Tensor& kl);

// Bytes per logit of `buffers` math-dtype [chunk, V] buffers alive at once:
// what a loss declares as its logit_bytes(), measured by
// tests/losses/loss_memory_test.cpp (which fails when a loss uses more).
inline double math_buffers(const sdk::LossShape& shape, double buffers) {
  return buffers * (shape.element_bytes >= 8 ? 8.0 : 4.0);
}

}  // namespace dflash::loss
