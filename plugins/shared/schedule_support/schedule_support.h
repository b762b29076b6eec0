// What the LR scheduler plugins share: how long the warm-up is, the warm-up
// ramp, and the decay shapes. Pure functions of the step; no LibTorch.
#pragma once

#include <dflash/sdk/schema.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace dflash::schedule {

// warmup_steps > 0 wins; otherwise warmup_ratio of the run (rounded), so the
// same config keeps its shape when the run length changes.
inline int64_t warmup_length(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::llround(warmup_ratio * static_cast<double>(std::max<int64_t>(total_steps, 0))));
}

// Linear from peak/warmup at step 0 to peak at step warmup − 1 (step 0 never
// trains at lr 0).
inline double warmup_lr(int64_t step, int64_t warmup, double peak) {
  return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
}

// Decay from 1 at progress 0 to 0 at progress 1.
inline double decay_factor(const std::string& shape, double progress) {
  const double p = std::clamp(progress, 0.0, 1.0);
  if (shape == "linear") return 1.0 - p;
  if (shape == "sqrt") return 1.0 - std::sqrt(p);
  return 0.5 * (1.0 + std::cos(M_PI * p));  // cosine
}

// The schema keys every warm-up schedule takes.
inline sdk::Schema& add_warmup_keys(sdk::Schema& schema, double default_ratio) {
  using sdk::Bounds;
  return schema
      .integer("warmup_steps", 0, "steps of linear warm-up; when > 0 it overrides warmup_ratio", Bounds::between(0, 1e9))
      .number("warmup_ratio", default_ratio, "warm-up as a fraction of the run's steps (used when warmup_steps = 0)",
              Bounds::between(0, 1));
}

}  // namespace dflash::schedule
