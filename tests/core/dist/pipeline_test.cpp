// The disaggregated pipeline on the CPU with Gloo and real processes (on
// GPUs through NCCL with DFLASH_TEST_DIST_DEVICE=cuda, dist_support.h):
// target ranks → hidden-state items → drafter ranks, against one process
// accumulating the same global batches; the credits that bound a drafter
// rank's queue; a target rank killed mid-run; refusals at start-up.
#include "core/dist/dist_support.h"
#include "support/expect.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

namespace fs = std::filesystem;
using test::dp_config;
using test::file_bytes;
using test::largest_relative_difference;
using test::launched;
using test::metrics_of;
using test::Result;

class Pipeline : public test::TwoRanks {};

std::string split(int targets, int drafters) {
  return " --target-ranks " + std::to_string(targets) + " --drafter-ranks " + std::to_string(drafters);
}

nlohmann::json trainer_state(const std::string& checkpoint) {
  return nlohmann::json::parse(file_bytes(checkpoint + "/trainer_state.json"));
}

// 1-2 also with the drafter ranks' optimizer sharded (ZeRO-1 over their group).
TEST_F(Pipeline, OneOneTwoOneAndOneTwoTrainTheDrafterAsOneProcessDoes) {
  test::TempDir temp("dflash_pipe");
  const std::string dir = temp.path().string();
  Result one = test::one_process("--config " + dp_config(dir, dir + "/one", 3), dir);
  ASSERT_EQ(one.status, 0) << one.err;
  const auto m1 = metrics_of(dir + "/one");
  struct Case {
    int targets, drafters;
    bool sharded;
  };
  std::vector<Case> cases = {Case{1, 1, false}, Case{2, 1, false}, Case{1, 2, false}, Case{1, 2, true}};
  // On GPUs also the splits of four (issue 19), where there are four GPUs.
  if (test::ranks_on_gpus())
    for (const Case& more : {Case{2, 2, false}, Case{3, 1, false}, Case{1, 3, false}}) cases.push_back(more);
  for (const auto& [targets, drafters, sharded] : cases) {
    if (!test::runs_here(targets + drafters, std::to_string(targets) + "-" + std::to_string(drafters))) continue;
    const std::string name = std::to_string(targets) + "-" + std::to_string(drafters) + (sharded ? " sharded" : "");
    const std::string out = dir + "/split" + std::to_string(targets) + std::to_string(drafters) + (sharded ? "s" : "");
    Result run = launched(targets + drafters,
                          "--config " + dp_config(dir, out, 3) + split(targets, drafters) +
                              (sharded ? " --set train.shard_optimizer=true" : ""),
                          dir);
    ASSERT_EQ(run.status, 0) << name << "\n" << run.err;
    EXPECT_CONTAINS(run.err, "target rank 0 (rank 0) of " + std::to_string(targets) + " target + " + std::to_string(drafters));
    EXPECT_CONTAINS(run.err, "hidden-state item: ");
    EXPECT_LE(largest_relative_difference(out + "/checkpoints/step-00000003", dir + "/one/checkpoints/step-00000003"),
              test::across_runs(1e-6))
        << name;
    EXPECT_EQ(trainer_state(out + "/checkpoints/step-00000003").at("data_state"),
              trainer_state(dir + "/one/checkpoints/step-00000003").at("data_state"))
        << name << ": the target ranks read the data as one process does";
    const auto mn = metrics_of(out);
    ASSERT_EQ(mn.size(), 3u) << name;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(mn[i].at("loss").get<double>(), m1[i].at("loss").get<double>(), test::across_runs(1e-5) * std::abs(m1[i].at("loss").get<double>()));
      EXPECT_EQ(mn[i].at("world_size"), targets + drafters);
      const nlohmann::json& p = mn[i].at("pipeline");
      EXPECT_EQ(p.at("targets").size(), static_cast<size_t>(targets));
      EXPECT_EQ(p.at("drafters").size(), static_cast<size_t>(drafters));
      EXPECT_GT(p.at("produced_tokens_per_s").get<double>(), 0);
      EXPECT_GT(p.at("consumed_tokens_per_s").get<double>(), 0);
      EXPECT_GT(p.at("item_bytes").get<int64_t>(), 0);
      for (const char* key : {"target_stall_fraction", "drafter_stall_fraction"}) {
        EXPECT_GE(p.at(key).get<double>(), 0) << key;
        EXPECT_LE(p.at(key).get<double>(), 1) << key;
      }
      for (const auto& d : p.at("drafters")) EXPECT_LE(d.at("queue_most_held").get<int64_t>(), 2) << "train.queue_depth's default";
      int64_t micro = 0;
      if (drafters > 1)
        for (const auto& r : mn[i].at("ranks")) micro += r.at("micro_batches").get<int64_t>();
      if (drafters > 1) EXPECT_EQ(micro, 6) << "the drafter ranks share the global batch";
    }
  }
}

// The test plugins (test_data → test_target → a test_drafter that sleeps in
// every forward): target ranks far faster than the one drafter rank.
std::string slow_drafter_config(const std::string& dir, const std::string& output, int queue_depth, int steps) {
  const nlohmann::json config = {
      {"train", {{"seed", 1}, {"steps", steps}, {"lr", 1e-2}, {"output_dir", output}, {"progress", "lines"},
                 {"grad_accumulation", 4}, {"queue_depth", queue_depth}, {"collective_timeout_s", 60}}},
      {"data", {{"plugin", "test_data"}, {"batches", 1000}, {"rows", 2}, {"length", 6}}},
      {"target", {{"plugin", "test_target"}}},
      {"drafter", {{"plugin", "test_drafter"}, {"delay_ms", 40}}},
      {"loss", {{"plugin", "ce"}}},
      {"scheduler", {{"plugin", "constant"}}}};
  const std::string path = dir + "/slow" + std::to_string(queue_depth) + ".json";
  std::ofstream(path) << config.dump(2);
  return path;
}

TEST_F(Pipeline, CreditsBoundTheItemsADrafterRankHoldsAndTheTargetsStallIsReported) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(3);
  test::TempDir temp("dflash_pipe_credit");
  const std::string dir = temp.path().string();
  for (int depth : {1, 3}) {
    const std::string out = dir + "/depth" + std::to_string(depth);
    Result run = launched(3, "--config " + slow_drafter_config(dir, out, depth, 4) + split(2, 1), dir);
    ASSERT_EQ(run.status, 0) << run.err;
    const auto m = metrics_of(out);
    ASSERT_EQ(m.size(), 4u);
    int64_t most = 0;
    for (const auto& record : m) {
      const nlohmann::json& p = record.at("pipeline");
      most = std::max(most, p.at("drafters")[0].at("queue_most_held").get<int64_t>());
      EXPECT_LE(p.at("queue_max").get<int64_t>(), depth);
    }
    EXPECT_EQ(most, depth) << "two fast target ranks keep the drafter rank's queue full, never fuller";
    // The last steps: both target ranks wait for slots most of the time.
    const nlohmann::json& last = m.back().at("pipeline");
    EXPECT_GT(last.at("target_stall_fraction").get<double>(), 0.5) << last.dump();
    EXPECT_LT(last.at("drafter_stall_fraction").get<double>(), 0.5) << last.dump();
    EXPECT_EQ(last.at("bound"), "drafter");
    EXPECT_CONTAINS(run.err, "pipeline drafter-bound: target ranks waited");
    EXPECT_CONTAINS(run.err, "try --target-ranks 1 --drafter-ranks 2");
  }
}

// The data ends in the middle of a step (10 batches, 4 per step): every
// rank learns it, the partial step trains as on one process, and the final
// checkpoint records the position at the end.
TEST_F(Pipeline, DataThatEndsMidStepEndsTheRunAsOnOneProcess) {
  test::TempDir temp("dflash_pipe_end");
  const std::string dir = temp.path().string();
  auto config = [&](const std::string& name) {
    const std::string path = slow_drafter_config(dir, dir + "/" + name, 2, 100);
    nlohmann::json c = nlohmann::json::parse(file_bytes(path));
    c["data"]["batches"] = 10;
    c["drafter"]["delay_ms"] = 0;
    const std::string mine = dir + "/" + name + ".json";
    std::ofstream(mine) << c.dump(2);
    return mine;
  };
  Result one = test::run_alone("--config " + config("one"), dir);
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_CONTAINS(one.err, "the data source has ended");
  const auto m1 = metrics_of(dir + "/one");
  ASSERT_EQ(m1.size(), 3u) << "steps 0, 1 and the partial step 2";
  for (const auto& [targets, drafters] : {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    if (!test::runs_here(targets + drafters, std::to_string(targets) + "-" + std::to_string(drafters))) continue;
    const std::string name = "split" + std::to_string(targets) + std::to_string(drafters);
    Result run = launched(targets + drafters, "--config " + config(name) + split(targets, drafters), dir);
    ASSERT_EQ(run.status, 0) << name << "\n" << run.err;
    EXPECT_CONTAINS(run.err, "the data source has ended");
    const auto m = metrics_of(dir + "/" + name);
    ASSERT_EQ(m.size(), m1.size()) << name;
    for (size_t i = 0; i < m.size(); ++i)
      EXPECT_NEAR(m[i].at("loss").get<double>(), m1[i].at("loss").get<double>(), test::across_runs(1e-5) * std::abs(m1[i].at("loss").get<double>()))
          << name << " step " << i;
    EXPECT_EQ(trainer_state(dir + "/" + name + "/checkpoints/step-00000003").at("data_state"),
              trainer_state(dir + "/one/checkpoints/step-00000003").at("data_state"))
        << name;
    EXPECT_LE(largest_relative_difference(dir + "/" + name + "/checkpoints/step-00000003", dir + "/one/checkpoints/step-00000003"),
              test::across_runs(1e-6))
        << name;
  }
}

TEST_F(Pipeline, ATargetRankKilledStopsTheDrafterNamingItAndResumeWorksWithAnotherSplit) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(3);
  test::TempDir temp("dflash_pipe_kill");
  const std::string dir = temp.path().string();
  const std::string config = dp_config(dir, dir + "/run", 400);
  const std::string args = " --set train.checkpoint_every=2 --set train.keep_checkpoints=3 --set train.collective_timeout_s=30";
  const std::string err_file = dir + "/launch.txt";
  const test::Background run =
      test::launch_in_background("", "--config " + config + args + split(2, 1), err_file, dir + "/run/checkpoints/step-00000004", 3);
  ASSERT_GT(run.launcher, 0);
  ASSERT_NE(run.rank1, 0) << file_bytes(err_file);
  const test::Ended ended = test::signal_and_wait(run.rank1, SIGKILL, run.launcher);  // target rank 1
  const std::string log = file_bytes(err_file);
  ASSERT_GT(ended.exit_status, 0) << log;
  EXPECT_LT(ended.seconds, 30.0) << "within train.collective_timeout_s";
  EXPECT_CONTAINS(log, "[rank 2/3]");
  EXPECT_CONTAINS(log, "rank 1 stopped responding");
  const test::Latest latest = test::latest_checkpoint(dir + "/run/checkpoints");
  ASSERT_GE(latest.step, 0);
  // Resumed with the other split: 1 target rank, 2 drafter ranks.
  Result again = launched(3, "--config " + config + args + split(1, 2) + " --set train.steps=" + std::to_string(latest.step + 4), dir);
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_CONTAINS(again.err, "resumed from " + dir + "/run/checkpoints/" + latest.name);
  const auto m = metrics_of(dir + "/run");
  ASSERT_FALSE(m.empty());
  EXPECT_EQ(m.back().at("step"), latest.step + 3);
  EXPECT_EQ(m.back().at("pipeline").at("drafter_ranks"), 2);
}

// Target rank 0 also serves the run's store: killing it stops the drafter
// ranks at once, naming it, with the checkpoint before intact.
TEST_F(Pipeline, KillingTargetRankZeroWhichServesTheStoreIsNamedToo) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(3);
  test::TempDir temp("dflash_pipe_kill0");
  const std::string dir = temp.path().string();
  const std::string config = dp_config(dir, dir + "/run", 400);
  const std::string args = " --set train.checkpoint_every=2 --set train.collective_timeout_s=30" + split(1, 2);
  const std::string err_file = dir + "/launch.txt";
  const test::Background run =
      test::launch_in_background("", "--config " + config + args, err_file, dir + "/run/checkpoints/step-00000002", 3);
  ASSERT_GT(run.launcher, 0);
  ASSERT_NE(run.rank0, 0) << file_bytes(err_file);
  const test::Ended ended = test::signal_and_wait(run.rank0, SIGKILL, run.launcher);
  const std::string log = file_bytes(err_file);
  EXPECT_NE(ended.exit_status, 0) << log;
  EXPECT_LT(ended.seconds, 30.0);
  // Whether a drafter rank was receiving an item or granting a slot, it names rank 0.
  EXPECT_CONTAINS(log, "so rank 0 (which serves it) has exited or is stopped");
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints/latest"));
}

// SIGTERM to the drafter rank (a scheduler's time limit): it finishes the
// step, checkpoints and says stop; the target rank answers what was granted,
// and both exit cleanly; the same command resumes.
TEST_F(Pipeline, SigtermStopsTheDrafterRankWithACheckpointAndTheTargetRankFollows) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(2);
  test::TempDir temp("dflash_pipe_term");
  const std::string dir = temp.path().string();
  const std::string config = dp_config(dir, dir + "/run", 400);
  const std::string args = " --set train.checkpoint_every=2 --set train.collective_timeout_s=30" + split(1, 1);
  const std::string err_file = dir + "/launch.txt";
  const test::Background run =
      test::launch_in_background("", "--config " + config + args, err_file, dir + "/run/checkpoints/step-00000002", 2);
  ASSERT_GT(run.launcher, 0);
  ASSERT_NE(run.rank1, 0) << file_bytes(err_file);
  const test::Ended ended = test::signal_and_wait(run.rank1, SIGTERM, run.launcher);  // the drafter rank
  const std::string log = file_bytes(err_file);
  EXPECT_EQ(ended.exit_status, 7) << log;
  EXPECT_CONTAINS(log, "SIGTERM: stopping before step");
  EXPECT_CONTAINS(log, "target rank 0 (rank 0): ");  // its totals: it ended on its own
  EXPECT_NOT_CONTAINS(log, "rank 0 ended: killed");
  const test::Latest latest = test::latest_checkpoint(dir + "/run/checkpoints");
  ASSERT_GE(latest.step, 0);
  EXPECT_EQ(metrics_of(dir + "/run").back().at("step"), latest.step - 1) << "the checkpoint holds every step trained";
  Result again = launched(2, "--config " + config + args + " --set train.steps=" + std::to_string(latest.step + 2), dir);
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_CONTAINS(again.err, "resumed from " + dir + "/run/checkpoints/" + latest.name);
  EXPECT_EQ(metrics_of(dir + "/run").back().at("step"), latest.step + 1);
}

TEST_F(Pipeline, MisplacedWeightsAndTopologiesThatDoNotAddUpAreRefused) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(4);
  test::TempDir temp("dflash_pipe_refuse");
  const std::string dir = temp.path().string();
  const std::string config = slow_drafter_config(dir, dir + "/run", 2, 2);
  // A target that hands its lm_head over on another device.
  Result frozen = launched(2, "--config " + config + split(1, 1) + " --set target.frozen_device=meta --set drafter.delay_ms=0", dir);
  EXPECT_EQ(frozen.status, 2) << frozen.err;
  EXPECT_CONTAINS(frozen.err, "test_target");
  EXPECT_CONTAINS(frozen.err, "its frozen weight 'lm_head' is on meta, but this target rank runs on cpu");
  // A drafter that keeps its parameter on another device.
  Result parameter =
      launched(2, "--config " + config + split(1, 1) + " --set drafter.parameter_device=meta --set drafter.delay_ms=0", dir);
  EXPECT_NE(parameter.status, 0) << parameter.err;
  EXPECT_CONTAINS(parameter.err, "parameter 'proj.weight' is on meta, but this rank trains on cpu");
  // Topologies that do not add up.
  Result world = launched(2, "--config " + config + split(2, 1), dir);
  EXPECT_EQ(world.status, 2) << world.err;
  EXPECT_CONTAINS(world.err, "train.topology is 2 target + 1 drafter ranks = 3 ranks, but this run has 2");
  Result batch = launched(4, "--config " + config + split(3, 1) + " --set train.grad_accumulation=2", dir);
  EXPECT_EQ(batch.status, 2) << batch.err;
  EXPECT_CONTAINS(batch.err, "train.grad_accumulation is 2 data-source batches per step, fewer than the 3 target ranks");
  Result alone = test::run_alone("--config " + config + split(1, 1), dir);
  EXPECT_EQ(alone.status, 2) << alone.err;
  EXPECT_CONTAINS(alone.err, "train.mode is disaggregated, which needs 2 ranks");
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl")) << "nothing trained";
  // A split whose drafter rank cannot hold its queue is refused by every
  // rank before any joins, with both roles' plans.
  const std::string small = dp_config(dir, dir + "/small", 2);
  Result short_of = launched(2, "--config " + small + split(1, 1) + " --gpu-memory 2MiB --queue-depth 4", dir);
  EXPECT_EQ(short_of.status, 6) << short_of.err;
  EXPECT_CONTAINS(short_of.err, "memory plan for cpu (drafter rank)");
  EXPECT_CONTAINS(short_of.err, "hidden-state items queued: 4 × ");
  EXPECT_CONTAINS(short_of.err, "the run does not fit");
  EXPECT_FALSE(fs::exists(dir + "/small/metrics.jsonl")) << "nothing trained";
}

}  // namespace
}  // namespace dflash
