// scheduler/constant: the learning rate stays at base_lr × scale, after an
// optional linear warm-up. Needs no LibTorch.
#include <dflash/sdk/scheduler.hpp>

#include <algorithm>

namespace {

class ConstantSchedule : public dflash::sdk::Scheduler {
 public:
  static constexpr dflash::sdk::PluginInfo info{"constant", "1.0.0",
                                                "constant learning rate, with an optional linear warm-up"};

  static std::string config_schema() {
    using dflash::sdk::Bounds;
    return dflash::sdk::Schema()
        .number("scale", 1.0, "multiplies the optimizer's base lr", Bounds::above(0).up_to(1e3))
        .integer("warmup_steps", 0, "steps of linear warm-up from 0 (0 = none)", Bounds::between(0, 1e9))
        .dump();
  }

  explicit ConstantSchedule(const dflash::sdk::CreateContext& context)
      : scale_(context.config().at("scale").get<double>()),
        warmup_steps_(context.config().at("warmup_steps").get<int64_t>()) {}

  double lr_at(int64_t step, int64_t /*total_steps*/, double base_lr) const {
    const double peak = base_lr * scale_;
    if (warmup_steps_ > 0 && step < warmup_steps_) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
    return peak;
  }

 private:
  double scale_;
  int64_t warmup_steps_;
};

}  // namespace

DFLASH_PLUGINS(ConstantSchedule)
