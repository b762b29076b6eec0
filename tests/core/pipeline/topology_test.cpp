// The disaggregated pipeline's pure parts: which rank produces and trains
// each micro-batch, which ranks talk, what a drafter rank receives in a
// step, the refusals, the split forecast and the advice line.
#include "config/config_schema.h"
#include "pipeline/calibration.h"
#include "pipeline/drafter_feed.h"
#include "pipeline/topology.h"
#include "support/expect.h"
#include "train/train_schema.h"
#include "train/train_settings.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

train::TrainSettings settings(int targets, int drafters, int64_t global_batch) {
  nlohmann::json train = config::defaults_of(train::train_schema());
  train["mode"] = "disaggregated";
  train["topology"] = {{"target_ranks", targets}, {"drafter_ranks", drafters}};
  train["grad_accumulation"] = global_batch;
  return train::parse_train_settings(train);
}

TEST(Topology, MicroBatchMGoesToTargetMModTAndDrafterMModD) {
  const pipeline::Topology t(settings(3, 2, 6), 5);
  EXPECT_EQ(t.role_of(2), pipeline::Role::kTarget);
  EXPECT_EQ(t.role_of(3), pipeline::Role::kDrafter);
  EXPECT_EQ(t.drafter_world_ranks(), (std::vector<int>{3, 4}));
  for (int64_t m = 0; m < 6; ++m) {
    EXPECT_EQ(t.target_of(m), m % 3);
    EXPECT_EQ(t.drafter_of(m), 3 + m % 2);
  }
  // Target 0 makes micro-batches 0 and 3 (drafters 3 and 4), and sends drafter rank 0 each step's end.
  EXPECT_EQ(t.drafters_fed_by(0), (std::vector<int>{3, 4}));
  EXPECT_EQ(t.drafters_fed_by(1), (std::vector<int>{3, 4}));  // micro-batches 1 and 4
  EXPECT_EQ(t.targets_feeding(3), (std::vector<int>{0, 1, 2}));  // micro-batches 0, 2, 4
  // Drafter rank 0's step: its micro-batches in order, then the step's end from target rank 0.
  const auto seq = t.drafter_sequence(3, 7);
  ASSERT_EQ(seq.size(), 4u);
  EXPECT_EQ(seq[0].micro, 0);
  EXPECT_EQ(seq[1].micro, 2);
  EXPECT_EQ(seq[1].source, 2);
  EXPECT_EQ(seq[2].micro, 4);
  EXPECT_TRUE(seq[3].step_end());
  EXPECT_EQ(seq[3].source, 0);
  EXPECT_EQ(seq[3].step, 7);
  EXPECT_EQ(t.drafter_sequence(4, 7).size(), 3u) << "drafter rank 1 gets no step end";
  EXPECT_EQ(pipeline::describe_rank(t, 4), "drafter rank 1 (rank 4)");
  EXPECT_EQ(pipeline::describe_rank(t, 1), "target rank 1 (rank 1)");
}

TEST(Topology, SplitsThatDoNotAddUpAreRefusedNamingTheFix) {
  EXPECT_THROW_WITH(pipeline::Topology(settings(3, 1, 4), 2), std::invalid_argument,
                    "train.topology is 3 target + 1 drafter ranks = 4 ranks, but this run has 2");
  EXPECT_THROW_WITH(pipeline::Topology(settings(1, 3, 2), 4), std::invalid_argument,
                    "fewer than the 3 drafter ranks");
  train::TrainSettings eval = settings(1, 1, 2);
  eval.eval_every = 10;
  EXPECT_THROW_WITH(pipeline::Topology(eval, 2), std::invalid_argument, "run `dflash-host eval` on a checkpoint");
}

TEST(Forecast, TheSlowerSideSetsThePaceAndTiesProposeNothing) {
  pipeline::Calibration c;
  c.tokens_per_batch = 1000;
  c.target_seconds = 0.1;
  c.drafter_seconds = 0.3;
  c.optimizer_seconds = 0.05;
  const auto f = pipeline::forecast_split(c, 1, 3, 6);
  EXPECT_DOUBLE_EQ(f.target_tokens_per_s, 6000 / (6 * 0.1));
  EXPECT_DOUBLE_EQ(f.drafter_tokens_per_s, 6000 / (2 * 0.3 + 0.05));
  EXPECT_EQ(f.bound, "drafter");
  const auto all = pipeline::forecast_splits(c, 4, 6);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.front().drafter_ranks, 3) << "the drafter is 3× slower: most ranks there";
  EXPECT_CONTAINS(pipeline::format_calibration(c, all, pipeline::forecast_split(c, 3, 1, 6)),
                  "fastest forecast: --target-ranks 1 --drafter-ranks 3");
  EXPECT_NOT_CONTAINS(pipeline::format_calibration(c, all, all.front()), "fastest forecast");
}

TEST(Advice, NamesTheSideThatBoundsThePipelineAndWhatToTry) {
  const pipeline::Topology t(settings(2, 2, 4), 4);
  std::string bound;
  EXPECT_CONTAINS(pipeline::pipeline_advice(t, 0.02, 0.61, bound),
                  "pipeline target-bound: drafter ranks waited 61 % of the time for data");
  EXPECT_EQ(bound, "target");
  EXPECT_CONTAINS(pipeline::pipeline_advice(t, 0.02, 0.61, bound), "try --target-ranks 3 --drafter-ranks 1");
  EXPECT_CONTAINS(pipeline::pipeline_advice(t, 0.7, 0.05, bound), "try --target-ranks 1 --drafter-ranks 3");
  EXPECT_EQ(bound, "drafter");
  EXPECT_CONTAINS(pipeline::pipeline_advice(t, 0.05, 0.08, bound), "pipeline balanced");
  EXPECT_EQ(bound, "balanced");
}

}  // namespace
}  // namespace dflash
