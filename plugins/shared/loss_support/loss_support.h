// What the loss plugins share: their settings, input validation with
// specific messages, the row coefficients of a weighted reduction, and the
// per-row quantities every loss reports. Built into each loss plugin (static).
//
// Conventions common to all dflash losses (docs/losses.md):
//   - A row whose target equals ignore_index adds nothing: no CE, no KL, no
//     gradient. Its per-row metrics are 0.
//   - loss = Σ_i c_i · ℓ_i with c_i = w_i / Σ_valid w (mean) or c_i = w_i (sum);
//     all rows ignored gives loss 0 and zero gradients, never NaN.
//   - ℓ_i = (1 − α)·CE_i + α·T²·KL_i(teacher_T ‖ student_T), α = kl_weight,
//     T = temperature (CE always at temperature 1, as in Hinton et al.).
//   - Softmax arithmetic runs in fp32 (fp64 for fp64 inputs) whatever the
//     input dtype; GEMMs run in the input dtype.
#pragma once

#include <dflash/sdk/loss.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <string>

namespace dflash::loss {

struct LossSettings {
  double temperature = 1.0;
  double kl_weight = 0.0;  // α
  bool mean = true;        // reduction
  int64_t topk = 0;        // topk_kl: columns of the teacher's top-K used (0 = all)
  int64_t chunk_size = 0;  // fused: rows per chunk (0 = from chunk_memory_mb)
  double chunk_memory_mb = 512;
};

// Schema pieces, so every loss spells a shared setting the same way.
sdk::Schema& add_reduction(sdk::Schema& schema);
sdk::Schema& add_distillation(sdk::Schema& schema, double default_kl_weight);
LossSettings read_settings(const nlohmann::json& config);

enum class TeacherNeed { kNone, kHidden, kTopK };

// Checks shapes, dtypes, devices and values; throws sdk::Error naming the
// tensor and what was expected. `teacher` says which teacher signal the loss
// will read (kNone when kl_weight is 0).
void validate_inputs(const sdk::LossInputs& in, TeacherNeed teacher);

// The accumulation dtype of the softmax arithmetic for an input dtype.
at::ScalarType math_dtype(at::ScalarType input);

// c_i of the reduction (0 on ignored rows), in math dtype, and the valid mask.
struct RowCoefficients {
  at::Tensor coefficient;  // [N]
  at::Tensor valid;        // [N] bool
  at::Tensor safe_targets; // [N] int64, ignored rows mapped to 0
};
RowCoefficients row_coefficients(const sdk::LossInputs& in, bool mean);

// The student's full logits z = h·Wᵀ in the math dtype and the per-row
// CE = lse(z) − z[y] (the reference plugins' common first step).
struct FullLogits {
  at::Tensor logits;   // [N, V]
  at::Tensor ce_rows;  // [N]
};
FullLogits full_logits(const sdk::LossInputs& in, const RowCoefficients& rows);

// The loss Σ c·ℓ and the metrics of a reference plugin that holds full logits.
sdk::LossResult finish_full(const sdk::LossInputs& in, const RowCoefficients& rows, const FullLogits& student,
                            const at::Tensor& row_loss, const at::Tensor& kl_rows);

// Metrics every loss reports: per-row "ce", "kl" (when a teacher is used) and
// "accuracy" ([N], 0 on ignored rows), and the weighted means
// "weighted_ce" / "weighted_kl" (0-dim; Σ w·x / Σ w over valid rows).
void add_metrics(sdk::LossResult& result, const at::Tensor& ce_rows, const at::Tensor& kl_rows,
                 const at::Tensor& correct_rows, const RowCoefficients& rows, const sdk::LossInputs& in);

// Bytes of one element of the math dtype for an input element size.
inline int64_t math_bytes(int32_t element_bytes) { return element_bytes >= 8 ? 8 : 4; }

}  // namespace dflash::loss
