// scheduler/wsd: warm-up, stable, decay. Linear warm-up to the peak, the peak
// held, then a decay over the last decay_ratio of the run to min_lr_ratio ×
// peak at the last step. A run can be extended from a stable-phase checkpoint
// by raising the total steps: nothing before the decay depends on them.
#include "schedule_support.h"

#include <dflash/sdk/scheduler.hpp>

namespace {
using namespace dflash;

class WarmupStableDecay : public sdk::Scheduler {
 public:
  static constexpr sdk::PluginInfo info{"wsd", "1.0.0", "warm-up, stable at the peak, then decay over the last part"};

  static std::string config_schema() {
    using sdk::Bounds;
    sdk::Schema schema;
    schema.number("scale", 1.0, "multiplies the optimizer's base lr (the peak)", Bounds::above(0).up_to(1e3));
    schedule::add_warmup_keys(schema, 0.04);
    schema.number("decay_ratio", 0.2, "the decay phase, as a fraction of the run's steps", Bounds::between(0, 1));
    schema.string("decay_shape", "linear", "linear: 1 − p; sqrt: 1 − √p; cosine: (1 + cos πp) / 2",
                  {"linear", "sqrt", "cosine"});
    schema.number("min_lr_ratio", 0.0, "the lr at the last step, as a fraction of the peak", Bounds::between(0, 1));
    return schema.dump();
  }

  explicit WarmupStableDecay(const sdk::CreateContext& context)
      : scale_(context.config().at("scale").get<double>()),
        warmup_steps_(context.config().at("warmup_steps").get<int64_t>()),
        warmup_ratio_(context.config().at("warmup_ratio").get<double>()),
        decay_ratio_(context.config().at("decay_ratio").get<double>()),
        min_ratio_(context.config().at("min_lr_ratio").get<double>()),
        shape_(context.config().at("decay_shape").get<std::string>()) {}

  double lr_at(int64_t step, int64_t total_steps, double base_lr) const {
    const double peak = base_lr * scale_, floor = peak * min_ratio_;
    const int64_t warmup = schedule::warmup_length(warmup_steps_, warmup_ratio_, total_steps);
    if (step < warmup) return schedule::warmup_lr(step, warmup, peak);
    const auto decay = static_cast<int64_t>(std::llround(decay_ratio_ * static_cast<double>(total_steps)));
    const int64_t decay_start = std::max(warmup, total_steps - decay);
    if (decay == 0 || step < decay_start) return peak;
    // Progress 0 at the first decay step, 1 at the last step (total − 1).
    const int64_t span = std::max<int64_t>(1, total_steps - 1 - decay_start);
    const double progress = static_cast<double>(step - decay_start) / static_cast<double>(span);
    return floor + (peak - floor) * schedule::decay_factor(shape_, progress);
  }

 private:
  double scale_;
  int64_t warmup_steps_;
  double warmup_ratio_, decay_ratio_, min_ratio_;
  std::string shape_;
};

}  // namespace

DFLASH_PLUGINS(WarmupStableDecay)
