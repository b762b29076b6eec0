// The in-tree warmup_cosine and wsd schedulers, loaded as dflash-host loads
// them, checked step by step against the formulas written out here.
#include "plugin/instances.h"
#include "plugin/registry.h"

#include <gtest/gtest.h>

#include <cmath>

namespace {
using namespace dflash::host;

class Schedulers : public ::testing::Test {
 protected:
  void SetUp() override { registry_.add_directory(DFLASH_INTREE_PLUGIN_DIR); }
  SchedulerInstance make(const std::string& name, const nlohmann::json& config) {
    // Defaults come from the plugin's own schema, as the host's config resolution fills them.
    nlohmann::json full = config;
    for (const auto& [key, definition] : registry_.find(DFLASH_KIND_SCHEDULER, name).schema.at("properties").items())
      if (!full.contains(key)) full[key] = definition.at("default");
    return SchedulerInstance(registry_.find(DFLASH_KIND_SCHEDULER, name), full, {});
  }
  PluginRegistry registry_;
};

double cosine(double p) { return 0.5 * (1.0 + std::cos(M_PI * p)); }

TEST_F(Schedulers, WarmupCosineStepByStep) {
  auto s = make("warmup_cosine", {{"warmup_steps", 2}, {"min_lr_ratio", 0.1}, {"scale", 2.0}});
  const double base = 0.5, peak = 1.0, floor = 0.1;  // peak = base × scale
  EXPECT_DOUBLE_EQ(s.lr_at(0, 12, base), peak * 1 / 2);
  EXPECT_DOUBLE_EQ(s.lr_at(1, 12, base), peak);
  // Decay over steps 2…11: progress (step − 2) / 9.
  for (int64_t step = 2; step < 12; ++step)
    EXPECT_NEAR(s.lr_at(step, 12, base), floor + (peak - floor) * cosine((step - 2) / 9.0), 1e-12) << step;
  EXPECT_DOUBLE_EQ(s.lr_at(11, 12, base), floor) << "the last step reaches the floor";
  EXPECT_DOUBLE_EQ(s.lr_at(30, 12, base), floor) << "past the end it stays there";
  EXPECT_FALSE(s.has_state());
}

TEST_F(Schedulers, WarmupCosineTakesItsWarmupAsARatioOfTheRun) {
  auto s = make("warmup_cosine", {{"warmup_ratio", 0.25}});
  // 100 steps → 25 warm-up steps; 8 steps → 2.
  EXPECT_DOUBLE_EQ(s.lr_at(0, 100, 1.0), 1.0 / 25);
  EXPECT_DOUBLE_EQ(s.lr_at(24, 100, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(25, 100, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(0, 8, 1.0), 0.5);
  EXPECT_NEAR(s.lr_at(5, 8, 1.0), cosine(3.0 / 5), 1e-12);
  double previous = 2;
  for (int64_t step = 25; step < 100; ++step) {
    const double lr = s.lr_at(step, 100, 1.0);
    EXPECT_LE(lr, previous) << "non-increasing after the warm-up, step " << step;
    previous = lr;
  }
  // The recipe's default: 4 % warm-up, decay to 0.
  auto d = make("warmup_cosine", {});
  EXPECT_DOUBLE_EQ(d.lr_at(0, 1000, 6e-4), 6e-4 / 40);
  EXPECT_DOUBLE_EQ(d.lr_at(999, 1000, 6e-4), 0.0);
}

TEST_F(Schedulers, WsdWarmupStableDecayStepByStep) {
  auto s = make("wsd", {{"warmup_steps", 2}, {"decay_ratio", 0.3}, {"min_lr_ratio", 0.2}});
  const double peak = 1.0, floor = 0.2;
  EXPECT_DOUBLE_EQ(s.lr_at(0, 10, peak), 0.5);
  for (int64_t step = 1; step <= 7; ++step) EXPECT_DOUBLE_EQ(s.lr_at(step, 10, peak), peak) << step;
  // Decay over steps 7…9 (3 = 0.3 × 10 steps): progress (step − 7) / 2, linear.
  EXPECT_DOUBLE_EQ(s.lr_at(8, 10, peak), floor + (peak - floor) * 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9, 10, peak), floor);
  auto root = make("wsd", {{"warmup_steps", 2}, {"decay_ratio", 0.3}, {"min_lr_ratio", 0.2}, {"decay_shape", "sqrt"}});
  EXPECT_NEAR(root.lr_at(8, 10, peak), floor + (peak - floor) * (1 - std::sqrt(0.5)), 1e-12);
  auto cos_shape = make("wsd", {{"warmup_steps", 2}, {"decay_ratio", 0.3}, {"decay_shape", "cosine"}});
  EXPECT_NEAR(cos_shape.lr_at(8, 10, peak), cosine(0.5), 1e-12);
}

TEST_F(Schedulers, WsdStablePhaseDoesNotDependOnTheRunLength) {
  auto s = make("wsd", {{"warmup_steps", 3}, {"decay_ratio", 0.1}});
  // A 100-step run extended to 200 steps: every step before the first run's
  // decay has the same lr in both.
  for (int64_t step = 0; step < 90; ++step) EXPECT_DOUBLE_EQ(s.lr_at(step, 100, 1.0), s.lr_at(step, 200, 1.0)) << step;
  auto no_decay = make("wsd", {{"warmup_steps", 3}, {"decay_ratio", 0.0}});
  EXPECT_DOUBLE_EQ(no_decay.lr_at(99, 100, 1.0), 1.0);
}

TEST_F(Schedulers, BadSettingsAreRefusedByTheirSchemas) {
  const auto& wsd = registry_.find(DFLASH_KIND_SCHEDULER, "wsd").schema.at("properties");
  EXPECT_EQ(wsd.at("decay_shape").at("enum"), (nlohmann::json{"linear", "sqrt", "cosine"}));
  EXPECT_EQ(wsd.at("decay_ratio").at("maximum"), 1);
  const auto& cosine_schema = registry_.find(DFLASH_KIND_SCHEDULER, "warmup_cosine").schema.at("properties");
  EXPECT_EQ(cosine_schema.at("min_lr_ratio").at("minimum"), 0);
  EXPECT_EQ(cosine_schema.at("warmup_steps").at("minimum"), 0);
}

}  // namespace
