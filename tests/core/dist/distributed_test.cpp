// Data-parallel training on the CPU with Gloo and real processes: the ranks
// started by `dflash-host launch` and by hand with the torchrun variables,
// against one process with gradient accumulation over the same global
// batches; resume at another world size; a rank killed mid-step; ranks whose
// configs differ.
#include "support/expect.h"
#include "support/temp_dir.h"
#include "core/dist/dist_support.h"
#include "core/train/run_support.h"

#include <dflash/sdk/safetensors_torch.hpp>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

namespace dflash {
namespace {

namespace fs = std::filesystem;
using test::file_bytes;
using test::metrics_of;
using test::Result;
using test::dp_config;
using test::largest_relative_difference;
using test::launched;
using test::launch_in_background;
using test::Background;
using test::Ended;
using test::Latest;
using test::latest_checkpoint;
using test::signal_and_wait;

class DataParallel : public test::TwoRanks {};

TEST_F(DataParallel, TwoAndThreeRanksMatchOneProcessAccumulatingTheSameGlobalBatches) {
  test::TempDir temp("dflash_dp");
  const std::string dir = temp.path().string();
  Result one = test::one_process("--config " + dp_config(dir, dir + "/one", 3), dir);
  ASSERT_EQ(one.status, 0) << one.err;
  for (const std::string& sharded : {"false", "true"})
    for (int ranks : {2, 3}) {
      if (!test::runs_here(ranks, std::to_string(ranks) + " ranks")) continue;
      const std::string out = dir + "/ranks" + std::to_string(ranks) + "-" + sharded;
      Result many = launched(ranks, "--config " + dp_config(dir, out, 3) + " --set train.shard_optimizer=" + sharded, dir);
      ASSERT_EQ(many.status, 0) << many.err;
      EXPECT_CONTAINS(many.err, "[rank 1/" + std::to_string(ranks) + "]");
      const double difference = largest_relative_difference(out + "/checkpoints/step-00000003", dir + "/one/checkpoints/step-00000003");
      EXPECT_LE(difference, test::across_runs(1e-6)) << ranks << " ranks, shard_optimizer " << sharded;
      // One metrics file (rank 0's), with every rank's figures inside.
      const auto m1 = metrics_of(dir + "/one"), mn = metrics_of(out);
      ASSERT_EQ(mn.size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_NEAR(mn[i].at("loss").get<double>(), m1[i].at("loss").get<double>(), test::across_runs(1e-5) * std::abs(m1[i].at("loss").get<double>()));
        EXPECT_EQ(mn[i].at("world_size"), ranks);
        ASSERT_EQ(mn[i].at("ranks").size(), static_cast<size_t>(ranks));
        int64_t micro = 0;
        for (const auto& r : mn[i].at("ranks")) micro += r.at("micro_batches").get<int64_t>();
        EXPECT_EQ(micro, 6) << "the global batch is 6 data-source batches whatever the world size";
      }
      // The optimizer state is whole in the checkpoint whether it was sharded or not.
      EXPECT_EQ(file_bytes(out + "/checkpoints/step-00000003/trainer_state.json").empty(), false);
      const double state_difference = [&] {
        auto a = sdk::safetensors::File::open(out + "/checkpoints/step-00000003/optimizer.safetensors");
        auto b = sdk::safetensors::File::open(dir + "/one/checkpoints/step-00000003/optimizer.safetensors");
        EXPECT_EQ(a->tensors().size(), b->tensors().size());
        double worst = 0;
        for (const auto& info : b->tensors()) {
          const at::Tensor tb = sdk::safetensors::load_tensor(b, info).to(at::kDouble);
          const at::Tensor ta = sdk::safetensors::load_tensor(a, info.name).to(at::kDouble);
          worst = std::max(worst, (ta - tb).norm().item<double>() / std::max(1e-30, tb.norm().item<double>()));
        }
        return worst;
      }();
      EXPECT_LE(state_difference, test::across_runs(1e-5)) << "AdamW's moments, " << ranks << " ranks, shard_optimizer " << sharded;
    }
}

// Ranks started by hand with the variables torchrun sets, each its own process.
TEST_F(DataParallel, ATorchrunEnvironmentSetByHandTrainsAsTheLauncherDoes) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(2);
  test::TempDir temp("dflash_dp_env");
  const std::string dir = temp.path().string();
  const std::string config = dp_config(dir, dir + "/by-hand", 2);
  const std::string base = std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR +
                           " --config " + config + test::device_flag();
  const int port = 20000 + static_cast<int>(::getpid() % 20000);
  std::string script;
  for (int r = 0; r < 2; ++r)
    // torchrun also sets OMP_NUM_THREADS=1 for several processes per node.
    script += "(RANK=" + std::to_string(r) + " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(r) +
              " LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " OMP_NUM_THREADS=1 " +
              "DFLASH_RUN_SECRET=" + test::kTestRunSecret + " " + base +
              " > /dev/null 2> " +
              dir + "/err" + std::to_string(r) + ".txt; echo $? > " + dir + "/status" + std::to_string(r) + ") & ";
  script += "wait";
  ASSERT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(file_bytes(dir + "/status" + std::to_string(r)), "0\n") << file_bytes(dir + "/err" + std::to_string(r) + ".txt");
  Result by_launcher = launched(2, "--config " + dp_config(dir, dir + "/launched", 2, "launched"), dir);
  ASSERT_EQ(by_launcher.status, 0) << by_launcher.err;
  EXPECT_LE(largest_relative_difference(dir + "/by-hand/checkpoints/step-00000002", dir + "/launched/checkpoints/step-00000002"),
            test::across_runs(0.0))
      << "the same ranks, the same result";
}

TEST_F(DataParallel, RanksWithDifferentConfigsAreRefusedNamingTheRankAndTheSetting) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(2);
  test::TempDir temp("dflash_dp_mismatch");
  const std::string dir = temp.path().string();
  const std::string config = dp_config(dir, dir + "/run", 2);
  const std::string base = std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR +
                           " --config " + config + test::device_flag();
  const int port = 20000 + static_cast<int>((::getpid() + 7) % 20000);
  std::string script;
  for (int r = 0; r < 2; ++r)
    script += "(RANK=" + std::to_string(r) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
              " DFLASH_RUN_SECRET=" + test::kTestRunSecret + " " + base + (r == 1 ? " --set train.lr=0.002" : "") + " > /dev/null 2> " + dir + "/err" + std::to_string(r) +
              ".txt; echo $? > " + dir + "/status" + std::to_string(r) + ") & ";
  script += "wait";
  ASSERT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0);
  for (int r = 0; r < 2; ++r) {
    const std::string err = file_bytes(dir + "/err" + std::to_string(r) + ".txt");
    EXPECT_EQ(file_bytes(dir + "/status" + std::to_string(r)), "2\n") << err;
    EXPECT_CONTAINS(err, "rank 1 differs from rank 0");
    EXPECT_CONTAINS(err, "/config/train/lr: 0.003 on rank 0, 0.002 on rank 1");
  }
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl")) << "nothing trained";
}

// Resuming at another world size continues the same run: the data position
// and the losses of a run that went 1 → 2 → 3 ranks are those of one that
// never stopped.
TEST_F(DataParallel, ResumingAtAnotherWorldSizeContinuesTheRun) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(3);
  test::TempDir temp("dflash_dp_resume");
  const std::string dir = temp.path().string();
  const std::string every = " --set train.checkpoint_every=2 --set train.keep_checkpoints=10";
  Result whole = test::run_alone("--config " + dp_config(dir, dir + "/whole", 6) + every, dir);
  ASSERT_EQ(whole.status, 0) << whole.err;
  const std::string parts = dp_config(dir, dir + "/parts", 6, "parts");
  Result a = test::run_alone("--config " + parts + every + " --stop-after 2", dir);
  ASSERT_EQ(a.status, 0) << a.err;
  Result b = launched(2, "--config " + parts + every + " --stop-after 2", dir);
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_CONTAINS(b.err, "resumed from");
  Result c = launched(3, "--config " + parts + every + " --set train.shard_optimizer=true", dir);
  ASSERT_EQ(c.status, 0) << c.err;
  const auto mw = metrics_of(dir + "/whole"), mp = metrics_of(dir + "/parts");
  ASSERT_EQ(mw.size(), 6u);
  ASSERT_EQ(mp.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(mp[i].at("step"), mw[i].at("step"));
    EXPECT_NEAR(mp[i].at("loss").get<double>(), mw[i].at("loss").get<double>(), test::across_runs(1e-5) * std::abs(mw[i].at("loss").get<double>()))
        << "step " << i;
  }
  for (const std::string step : {"step-00000002", "step-00000004", "step-00000006"}) {
    const auto state = [&](const std::string& run) {
      return nlohmann::json::parse(file_bytes(dir + "/" + run + "/checkpoints/" + step + "/trainer_state.json"));
    };
    EXPECT_EQ(state("parts").at("data_state"), state("whole").at("data_state"))
        << step << ": the same data position, no sequence read twice or skipped";
  }
  EXPECT_LE(largest_relative_difference(dir + "/parts/checkpoints/step-00000006", dir + "/whole/checkpoints/step-00000006"),
            test::across_runs(1e-6));
}

// A rank killed in the middle of training: the others stop within the
// collective timeout naming it, the checkpoint before is whole, and the same
// command resumes from it.
TEST_F(DataParallel, ARankKilledMidStepStopsTheOthersNamingItAndARelaunchResumes) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(2);
  test::TempDir temp("dflash_dp_kill");
  const std::string dir = temp.path().string();
  const std::string config = dp_config(dir, dir + "/run", 400);
  const std::string args = " --set train.checkpoint_every=2 --set train.keep_checkpoints=3 --set train.collective_timeout_s=30";
  const std::string err_file = dir + "/launch.txt";
  const Background run = launch_in_background("", "--config " + config + args, err_file, dir + "/run/checkpoints/step-00000004");
  ASSERT_GT(run.launcher, 0);
  ASSERT_NE(run.rank1, 0) << file_bytes(err_file);
  const Ended ended = signal_and_wait(run.rank1, SIGKILL, run.launcher);
  const std::string log = file_bytes(err_file);
  ASSERT_GT(ended.exit_status, 0) << log;
  EXPECT_LT(ended.seconds, 30.0) << "within train.collective_timeout_s";
  EXPECT_CONTAINS(log, "[rank 0/2]");
  EXPECT_CONTAINS(log, "rank 1 stopped responding");
  EXPECT_NOT_CONTAINS(log, "Traceback");
  // The newest checkpoint is whole: the same command resumes from it (and
  // trains 4 steps more; the ranks may have gone on for a few steps before
  // the kill).
  const Latest latest = latest_checkpoint(dir + "/run/checkpoints");
  ASSERT_GE(latest.step, 0);
  Result again = launched(2, "--config " + config + args + " --set train.steps=" + std::to_string(latest.step + 4), dir);
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_CONTAINS(again.err, "resumed from " + dir + "/run/checkpoints/" + latest.name);
  const auto m = metrics_of(dir + "/run");
  ASSERT_FALSE(m.empty());
  EXPECT_EQ(m.back().at("step"), latest.step + 3);
}

// A rank that hangs (stopped: SIGSTOP) rather than dies: the others' next
// collective waits train.collective_timeout_s, then names it.
TEST_F(DataParallel, ARankThatHangsIsNamedWhenTheCollectiveTimesOut) {
  DFLASH_DIST_SKIP_UNLESS_RANKS(2);
  test::TempDir temp("dflash_dp_hang");
  const std::string dir = temp.path().string();
  const std::string config = dp_config(dir, dir + "/run", 400);
  const std::string err_file = dir + "/launch.txt";
  const Background run = launch_in_background(
      "--stop-grace-s 1", "--config " + config + " --set train.checkpoint_every=2 --set train.collective_timeout_s=4", err_file,
      dir + "/run/checkpoints/step-00000002");
  ASSERT_GT(run.launcher, 0);
  ASSERT_NE(run.rank1, 0) << file_bytes(err_file);
  const Ended ended = signal_and_wait(run.rank1, SIGSTOP, run.launcher);
  const std::string log = file_bytes(err_file);
  EXPECT_NE(ended.exit_status, 0) << log;
  EXPECT_CONTAINS(log, "rank 1 stopped responding");
  EXPECT_LT(ended.seconds, 4 + 3 + 1 + 10 + 10) << "timeout, diagnosis, grace, SIGTERM's wait";
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints/latest"));
}

// One rank under the launcher is the single process: the same metrics, bit
// for bit (only times and memory figures differ), and the same drafter.
TEST_F(DataParallel, OneRankUnderTheLauncherTrainsBitwiseAsOneProcess) {
  // Bit for bit is a CPU statement: GPU kernels' atomic adds may order a sum
  // differently from run to run (docs/distributed.md has the GPU's figures).
  if (test::ranks_on_gpus()) GTEST_SKIP() << "bitwise equality is checked on the CPU only";
  test::TempDir temp("dflash_dp_one");
  const std::string dir = temp.path().string();
  Result plain = test::run_alone("--config " + test::small_config(dir, dir + "/plain", 4), dir);
  ASSERT_EQ(plain.status, 0) << plain.err;
  Result one = launched(1, "--config " + test::small_config(dir, dir + "/one", 4), dir);
  ASSERT_EQ(one.status, 0) << one.err;
  const auto a = metrics_of(dir + "/plain"), b = metrics_of(dir + "/one");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* key : {"loss", "grad_norm", "lr", "slot_accuracy", "acceptance_length_sim", "loss_metrics"})
      EXPECT_EQ(b[i].at(key), a[i].at(key)) << "step " << i << ": " << key;
  EXPECT_EQ(file_bytes(dir + "/one/checkpoints/step-00000004/model.safetensors"),
            file_bytes(dir + "/plain/checkpoints/step-00000004/model.safetensors"));
}

// `plan --world-size N`: one rank's memory, with and without ZeRO-1.
TEST_F(DataParallel, PlanWithAWorldSizeShowsOneRanksShare) {
  test::TempDir temp("dflash_dp_plan");
  const std::string dir = temp.path().string();
  const std::string config = dp_config(dir, dir + "/run", 2);
  const std::string command = std::string(DFLASH_HOST_EXE) + " plan --no-default-plugin-dirs --plugin-dir " +
                              DFLASH_INTREE_PLUGIN_DIR + " --config " + config + " --json --world-size 4";
  auto plan = [&](const std::string& extra) {
    const std::string out = dir + "/plan.json";
    EXPECT_EQ(std::system((command + extra + " > " + out + " 2>/dev/null").c_str()), 0);
    return nlohmann::json::parse(file_bytes(out));
  };
  auto bytes = [](const nlohmann::json& p, const std::string& prefix) {
    int64_t total = 0;
    for (const auto& line : p.at("lines"))
      if (line.at("category").get<std::string>().rfind(prefix, 0) == 0) total += line.at("bytes").get<int64_t>();
    return total;
  };
  const nlohmann::json replicated = plan(""), sharded = plan(" --set train.shard_optimizer=true");
  EXPECT_EQ(replicated.at("world_size"), 4);
  EXPECT_GT(bytes(replicated, "gradient buckets"), 0);
  EXPECT_LT(bytes(sharded, "AdamW states"), bytes(replicated, "AdamW states"));
}

}  // namespace
}  // namespace dflash
