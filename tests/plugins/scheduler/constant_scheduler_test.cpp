// The in-tree scheduler/constant plugin, loaded from the build's plugin folder
// as dflash-host loads it.
#include "plugin/instances.h"
#include "plugin/registry.h"

#include <gtest/gtest.h>

namespace {
using namespace dflash::host;

TEST(ConstantScheduler, WarmupThenConstant) {
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  const PluginRecord& record = registry.find(DFLASH_KIND_SCHEDULER, "constant");
  SchedulerInstance schedule(record, {{"scale", 0.5}, {"warmup_steps", 4}}, {});
  const double base = 2e-3;
  EXPECT_DOUBLE_EQ(schedule.lr_at(0, 100, base), 1e-3 * 1 / 4);
  EXPECT_DOUBLE_EQ(schedule.lr_at(1, 100, base), 1e-3 * 2 / 4);
  EXPECT_DOUBLE_EQ(schedule.lr_at(3, 100, base), 1e-3);
  EXPECT_DOUBLE_EQ(schedule.lr_at(4, 100, base), 1e-3);
  EXPECT_DOUBLE_EQ(schedule.lr_at(99, 100, base), 1e-3);
  EXPECT_FALSE(schedule.has_state()) << "a pure function of the step";

  SchedulerInstance plain(record, {{"scale", 1.0}, {"warmup_steps", 0}}, {});
  EXPECT_DOUBLE_EQ(plain.lr_at(0, 10, base), base);
  EXPECT_EQ(record.schema.at("properties").at("warmup_steps").at("minimum"), 0);
  EXPECT_TRUE(record.schema.at("properties").at("warmup_steps").at("minimum").is_number_integer());
}

}  // namespace
