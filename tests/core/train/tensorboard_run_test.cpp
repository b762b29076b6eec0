// train.tensorboard (issue 44): the event file a real run writes, read by an
// independent reader (tests/core/metrics/read_tfevents.py: Debian's protoc
// and python3-crc32c, nothing of the writer), holds every step of
// metrics.jsonl once with its numbers; a resumed run rewrites the steps after
// its checkpoint instead of duplicating them; a killed run leaves a readable
// file; train.tensorboard=false writes none.
#include "support/temp_dir.h"
#include "core/train/run_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace {

using dflash::test::host;
using dflash::test::metrics_of;
using dflash::test::Result;
using dflash::test::small_config;
namespace fs = std::filesystem;

bool have_reader() {
  return std::system("command -v protoc > /dev/null 2>&1") == 0 &&
         std::system("/usr/bin/python3 -c 'import crc32c' > /dev/null 2>&1") == 0;
}

std::string events_file(const std::string& run) {
  for (const auto& entry : fs::directory_iterator(run))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) return entry.path().string();
  return {};
}

// The reader's view of the run's event file.
nlohmann::json read_events(const std::string& run, const std::string& scratch) {
  const std::string file = events_file(run);
  if (file.empty()) return nullptr;
  const std::string out = scratch + "/events.json";
  const std::string command = "/usr/bin/python3 " + std::string(DFLASH_SOURCE_DIR) + "/tests/core/metrics/read_tfevents.py '" +
                              file + "' > '" + out + "'";
  if (std::system(command.c_str()) != 0) return nullptr;
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

// Every step of metrics.jsonl once in the events, in order, each number of
// the record (under its JSON path) equal as a float.
void expect_events_match_metrics(const nlohmann::json& events, const std::vector<nlohmann::json>& records) {
  ASSERT_FALSE(events.is_null()) << "the independent reader could not read the event file";
  EXPECT_EQ(events.at("file_version"), "brain.Event:2");
  EXPECT_FALSE(events.at("torn_tail").get<bool>());
  const nlohmann::json& steps = events.at("steps");
  ASSERT_EQ(steps.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const int64_t step = records[i].at("step").get<int64_t>();
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_EQ(steps[i][0].get<int64_t>(), step);
    const nlohmann::json& values = steps[i][2];
    size_t numbers = 0;
    const nlohmann::json flat = records[i].flatten();  // "/loss_metrics/fused_ckpt_kl/ce" → value
    for (const auto& [pointer, value] : flat.items()) {
      if (!value.is_number() || pointer == "/step") continue;
      ++numbers;
      const std::string tag = pointer.substr(1);
      ASSERT_TRUE(values.contains(tag)) << "no scalar " << tag;
      const double expected = static_cast<float>(value.get<double>());
      EXPECT_NEAR(values.at(tag).get<double>(), expected, 1e-6 * std::max(1.0, std::fabs(expected))) << tag;
    }
    EXPECT_GE(numbers, 5u);
    EXPECT_EQ(values.size(), numbers) << "scalars that metrics.jsonl does not have";
  }
}

TEST(TensorBoardRun, EveryStepOnceWithItsNumbersAndAResumeRewritesInsteadOfDuplicating) {
  if (!have_reader()) GTEST_SKIP() << "needs Debian's protobuf-compiler and python3-crc32c (scripts/setup.sh --tests installs them)";
  dflash::test::TempDir temp("dflash_tensorboard");
  const std::string dir = temp.path().string(), run = dir + "/run";
  const std::string every2 = " --set train.checkpoint_every=2 --set train.keep_checkpoints=5";
  Result first = host("--config " + small_config(dir, run, 6) + every2, dir);
  ASSERT_EQ(first.status, 0) << first.err;
  expect_events_match_metrics(read_events(run, dir), metrics_of(run));

  // As if the run had died after logging step 5 but before its last
  // checkpoint: the run resumes from step 4 and writes steps 4 and 5 again.
  fs::remove_all(run + "/checkpoints/step-00000006");
  std::ofstream(run + "/checkpoints/latest") << "step-00000004\n";
  Result resumed = host("--config " + small_config(dir, run, 8) + every2, dir);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  const auto records = metrics_of(run);
  ASSERT_EQ(records.size(), 8u);
  const nlohmann::json events = read_events(run, dir);
  expect_events_match_metrics(events, records);
}

TEST(TensorBoardRun, AKilledRunLeavesAReadableFileAndOffWritesNone) {
  if (!have_reader()) GTEST_SKIP() << "needs Debian's protobuf-compiler and python3-crc32c (scripts/setup.sh --tests installs them)";
  dflash::test::TempDir temp("dflash_tensorboard_kill");
  const std::string dir = temp.path().string(), run = dir + "/run";
  // Killed in the middle of its second checkpoint (after step 3's record).
  const std::string command = "DFLASH_FAULT_ABORT_IN_SAVE=2 " + std::string(DFLASH_HOST_EXE) +
                              " --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR + " --config " +
                              small_config(dir, run, 6) + " --set train.checkpoint_every=2 > /dev/null 2>&1";
  const int status = std::system(command.c_str());
  ASSERT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the fault must kill the run";
  const auto records = metrics_of(run);
  ASSERT_GE(records.size(), 3u);
  expect_events_match_metrics(read_events(run, dir), records);

  const std::string off = dir + "/off";
  Result quiet = host("--config " + small_config(dir, off, 2) + " --set train.tensorboard=false", dir);
  ASSERT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(events_file(off), "");
  EXPECT_EQ(metrics_of(off).size(), 2u);
}

}  // namespace
