// AdamW over the drafter's parameters, owned by the host. Two precisions:
//   same        — states (exp_avg, exp_avg_sq) in the parameters' dtype; the
//                 update is computed in fp32 per tensor and rounded once.
//   fp32_master — an fp32 master copy of every weight plus fp32 states; the
//                 live (e.g. bf16) weights are rounded copies of the masters.
#pragma once

#include "plugin/host_api.h"
#include "train/optimizer.h"

#include <cstdint>

namespace dflash::train {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool fp32_master = false;
  // On CUDA (LibTorch ≥ 2.1): a fused kernel instead of the per-tensor loop.
  // Same formula; false keeps the loop (tests compare them).
  bool fused = true;
  // Which fused kernel: ours (adamw_kernel.h: one launch; bf16 or fp32
  // parameters in a CUDA build, else ATen's) or ATen's multi-tensor AdamW.
  // Ours is the default: 6.2 against 9.7 ms per step for the 1.7 B-parameter
  // drafter on an H200 (docs/performance.md, 2026-12-04).
  enum class Kernel { kAten, kOurs };
  Kernel kernel = Kernel::kOurs;
};

class AdamW final : public Optimizer {
 public:
  // `parameters`: the drafter's live leaves (name → tensor), updated in place.
  AdamW(host::NamedTensors parameters, const AdamWOptions& options);

  // Optimizer::step: on the fused kernel the factor is its grad_scale (the
  // gradients are scaled inside the update, not in a pass of their own).
  void step(double lr, double grad_factor = 1.0) override;
  void zero_grad() override;
  // Every state tensor under a stable name ("exp_avg.<param>", "exp_avg_sq.<param>",
  // "master.<param>"), plus "step" as a 0-dim int64 tensor: what a checkpoint stores.
  host::NamedTensors state() const;
  host::NamedTensors state() override { return static_cast<const AdamW&>(*this).state(); }
  host::NamedTensors local_state() const override { return state(); }
  // Restores state() (names of other parameters are ignored); throws naming
  // any tensor of its own parameters that is missing or misshapen.
  void load_state(const host::NamedTensors& state) override;
  int64_t steps_taken() const { return steps_; }
  const char* last_kernel() const override { return last_kernel_; }
  const host::NamedTensors& parameters() const { return parameters_; }

 private:
  host::NamedTensors parameters_;
  AdamWOptions options_;
  void fused_step(double lr, double grad_factor);
  // Our kernel's step; false (nothing done) where it does not apply.
  bool kernel_step(double lr, double grad_factor);

  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, master_;
  at::Tensor step_buffer_;              // fused: the step number per tensor (fp32, on the device)
  std::vector<at::Tensor> step_views_;  // its elements, one per parameter
  int64_t steps_ = 0;
  const char* last_kernel_ = "loop";
};

// sqrt(Σ ||grad||²) over the parameters (fp32 accumulation).
double global_grad_norm(const host::NamedTensors& parameters);
// The factor global-norm clipping to max_norm applies to the gradients
// (Optimizer::step's grad_factor): max_norm / (norm + 1e-6) above it, 1
// otherwise; max_norm 0 = no clipping.
double clip_factor(double grad_norm, double max_norm);

}  // namespace dflash::train
