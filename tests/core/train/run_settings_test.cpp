// The typed "train" section, the drafter's facts, the ZeRO-1 share, the
// launch environment: each parsed once, refused with a message naming what
// is wrong.
#include "config/config_schema.h"
#include "dist/process_group.h"
#include "plugin/drafter_facts.h"
#include "support/expect.h"
#include "train/sharded_adamw.h"
#include "train/train_schema.h"
#include "train/train_settings.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>

namespace dflash {
namespace {

TEST(TrainSettings, EveryKeyOfTheSchemaIsParsedWithTheSchemasDefault) {
  const nlohmann::json defaults = config::defaults_of(train::train_schema());
  const train::TrainSettings s = train::parse_train_settings(defaults);
  EXPECT_EQ(s.device, defaults.at("device"));
  EXPECT_EQ(s.steps, defaults.at("steps"));
  EXPECT_EQ(s.grad_accumulation, defaults.at("grad_accumulation"));
  EXPECT_DOUBLE_EQ(s.lr, defaults.at("lr").get<double>());
  EXPECT_DOUBLE_EQ(s.collective_timeout_s, defaults.at("collective_timeout_s").get<double>());
  EXPECT_EQ(s.shard_optimizer, defaults.at("shard_optimizer").get<bool>());
  EXPECT_EQ(s.mode, train::Mode::kColocated);
  EXPECT_EQ(s.fp32_master(), defaults.at("precision") == "fp32_master");
  EXPECT_EQ(s.wants_teacher(), defaults.at("teacher") == "hidden");
  // Every key the schema has is read: removing any one is an error naming it.
  for (const auto& [key, value] : defaults.items()) {
    nlohmann::json without = defaults;
    without.erase(key);
    try {
      train::parse_train_settings(without);
      ADD_FAILURE() << "train." << key << " is not read";
    } catch (const std::invalid_argument& e) {
      EXPECT_CONTAINS(std::string(e.what()), "train." + key);
    }
  }
}

TEST(TrainSettings, AValueOfTheWrongTypeOrOutsideTheSchemaIsNamed) {
  nlohmann::json train = config::defaults_of(train::train_schema());
  train["precision"] = "fp8";
  EXPECT_THROW_WITH(train::parse_train_settings(train), std::invalid_argument, "train.precision: 'fp8'");
  train = config::defaults_of(train::train_schema());
  train["steps"] = "many";
  EXPECT_THROW_WITH(train::parse_train_settings(train), std::invalid_argument, "train.steps");
}

TEST(DrafterFacts, AreReadFromExportConfigAndNeverGuessed) {
  const auto facts = host::parse_drafter_facts(
      nlohmann::json{{"block_size", 16}, {"target_layer_ids", {1, 9, 17, 25, 33}}, {"mask_token_id", 151669}}, "drafter x");
  EXPECT_EQ(facts.block_size, 16);
  EXPECT_EQ(facts.target_layer_ids, (std::vector<int64_t>{1, 9, 17, 25, 33}));
  // A mask token is the drafter's own key (a DFlash drafter's): not needed.
  EXPECT_NO_THROW(host::parse_drafter_facts(nlohmann::json{{"block_size", 8}, {"target_layer_ids", nlohmann::json::array()}}, "d"));
  for (const char* key : {"block_size", "target_layer_ids"}) {
    nlohmann::json exported = {{"block_size", 16}, {"target_layer_ids", {1}}, {"mask_token_id", 5}};
    exported.erase(key);
    EXPECT_THROW_WITH(host::parse_drafter_facts(exported, "drafter 'x' (libx.so)"), std::invalid_argument,
                      std::string("drafter 'x' (libx.so): its export_config has no ") + key);
  }
  EXPECT_THROW_WITH(host::parse_drafter_facts(nlohmann::json{{"block_size", 0}, {"target_layer_ids", {1}}, {"mask_token_id", 5}}, "d"),
                    std::invalid_argument, "block_size = 0, not an integer ≥ 1");
  EXPECT_THROW_WITH(host::parse_drafter_facts(nlohmann::json{{"block_size", 4}, {"target_layer_ids", {-1}}, {"mask_token_id", 5}}, "d"),
                    std::invalid_argument, "target_layer_ids[] = -1");
  EXPECT_THROW_WITH(host::parse_drafter_facts(std::nullopt, "d"), std::invalid_argument, "is missing");
}

TEST(ShardedOptimizer, TheShareGivesEachRankAboutOneNthOfTheElements) {
  const std::vector<int64_t> numels = {4096 * 1024, 1024 * 1024, 1024 * 1024, 4096, 4096, 1024 * 3072, 3072 * 1024, 1024, 17};
  for (int world : {1, 2, 3, 4}) {
    const std::vector<int> owner = train::shard_by_size(numels, world);
    std::vector<int64_t> load(static_cast<size_t>(world), 0);
    for (size_t i = 0; i < numels.size(); ++i) {
      ASSERT_GE(owner[i], 0);
      ASSERT_LT(owner[i], world);
      load[static_cast<size_t>(owner[i])] += numels[i];
    }
    const int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
    const int64_t largest = *std::max_element(numels.begin(), numels.end());
    for (int64_t l : load) EXPECT_LE(l, total / world + largest) << world << " ranks";
    EXPECT_EQ(train::shard_by_size(numels, world), owner) << "the same share on every rank";
  }
}

struct Environment {
  std::vector<std::string> names;
  explicit Environment(std::initializer_list<std::pair<const char*, const char*>> values) {
    for (const char* n : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "DFLASH_RUN_SECRET", "DFLASH_RUN_SECRET_FILE"})
      ::unsetenv(n);
    for (const auto& [n, v] : values) ::setenv(n, v, 1);
  }
  ~Environment() {
    for (const char* n : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "DFLASH_RUN_SECRET"})
      ::unsetenv(n);
  }
};

TEST(LaunchEnvironment, NoneIsOneProcessAPartialOneIsRefusedNamingWhatIsMissing) {
  {
    Environment none({});
    EXPECT_FALSE(dist::launch_environment().has_value());
  }
  {
    Environment partial({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
    EXPECT_THROW_WITH(dist::launch_environment(), std::invalid_argument, "$MASTER_ADDR, $MASTER_PORT not");
  }
  {
    Environment bad({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
    EXPECT_THROW_WITH(dist::launch_environment(), std::invalid_argument, "$RANK is '2'; expected a whole number from 0 to 1");
  }
  {
    Environment no_secret({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
    EXPECT_THROW_WITH(dist::launch_environment(), std::invalid_argument, "$DFLASH_RUN_SECRET is not set");
  }
  {
    Environment weak({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
                      {"DFLASH_RUN_SECRET", "password"}});
    EXPECT_THROW_WITH(dist::launch_environment(), std::invalid_argument, "$DFLASH_RUN_SECRET holds 8 characters; a run secret needs at least 32");
  }
  {
    Environment torchrun({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29400"},
                          {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                          {"TORCHELASTIC_RESTART_COUNT", "2"}, {"DFLASH_RUN_SECRET", "0123456789abcdef0123456789abcdef"}});
    const auto env = dist::launch_environment();
    ASSERT_TRUE(env.has_value());
    EXPECT_EQ(env->rank, 5);
    EXPECT_EQ(env->local_rank, 1);
    EXPECT_EQ(env->local_world_size, 4);
    EXPECT_TRUE(env->agent_store);
    EXPECT_EQ(env->restart_count, 2);
    ASSERT_TRUE(env->secret.has_value());
    EXPECT_EQ(env->secret->text(), "0123456789abcdef0123456789abcdef");
    EXPECT_EQ(dist::rank_device("cuda", *env), "cuda:1");
    EXPECT_EQ(dist::rank_device("cpu", *env), "cpu");
    EXPECT_THROW_WITH(dist::rank_device("cuda:0", *env), std::invalid_argument, "they would share one GPU");
  }
}

}  // namespace
}  // namespace dflash
