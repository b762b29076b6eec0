// scheduler/warmup_cosine: linear warm-up to base_lr × scale, then a cosine
// decay to min_lr_ratio × that peak at the last step (the DFlash recipe's
// schedule: about 4 % warm-up).
#include "schedule_support.h"

#include <dflash/sdk/scheduler.hpp>

namespace {
using namespace dflash;

class WarmupCosine : public sdk::Scheduler {
 public:
  static constexpr sdk::PluginInfo info{"warmup_cosine", "1.0.0",
                                        "linear warm-up, then cosine decay to a floor at the last step"};

  static std::string config_schema() {
    using sdk::Bounds;
    sdk::Schema schema;
    schema.number("scale", 1.0, "multiplies the optimizer's base lr (the peak)", Bounds::above(0).up_to(1e3));
    schedule::add_warmup_keys(schema, 0.04);
    schema.number("min_lr_ratio", 0.0, "the lr at the last step, as a fraction of the peak", Bounds::between(0, 1));
    return schema.dump();
  }

  explicit WarmupCosine(const sdk::CreateContext& context)
      : scale_(context.config().at("scale").get<double>()),
        warmup_steps_(context.config().at("warmup_steps").get<int64_t>()),
        warmup_ratio_(context.config().at("warmup_ratio").get<double>()),
        min_ratio_(context.config().at("min_lr_ratio").get<double>()) {}

  double lr_at(int64_t step, int64_t total_steps, double base_lr) const {
    const double peak = base_lr * scale_, floor = peak * min_ratio_;
    const int64_t warmup = schedule::warmup_length(warmup_steps_, warmup_ratio_, total_steps);
    if (step < warmup) return schedule::warmup_lr(step, warmup, peak);
    // Progress 0 at the first step after warm-up, 1 at the last step (total − 1).
    const int64_t span = std::max<int64_t>(1, total_steps - 1 - warmup);
    const double progress = static_cast<double>(step - warmup) / static_cast<double>(span);
    return floor + (peak - floor) * schedule::decay_factor("cosine", progress);
  }

 private:
  double scale_;
  int64_t warmup_steps_;
  double warmup_ratio_, min_ratio_;
};

}  // namespace

DFLASH_PLUGINS(WarmupCosine)
