// Nothing lost: what a careful but hostile user can do to a run's output
// directory and checkpoints (issue 14), each against the real dflash-host
// binary where the defect was found there. Every test here failed before the
// fix it covers.
#include "checkpoint/checkpoint.h"
#include "hash/file_hash.h"
#include "checkpoint/run_lock.h"
#include "support/expect.h"
#include "support/temp_dir.h"
#include "train/resume.h"
#include "core/train/run_support.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

namespace {
using namespace dflash;
using test::file_bytes;
using test::host;
using test::metrics_of;
using test::Result;
using test::small_config;

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string latest_of(const std::string& run) {
  std::ifstream in(run + "/checkpoints/latest");
  std::string name;
  std::getline(in, name);
  return name;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const std::string& path, const nlohmann::json& value) { std::ofstream(path) << value.dump(2); }

// The losses and the final drafter of two runs are bitwise the same.
void expect_same_run(const std::string& a, const std::string& b, int steps) {
  const auto ma = metrics_of(a), mb = metrics_of(b);
  ASSERT_EQ(ma.size(), static_cast<size_t>(steps)) << a;
  ASSERT_EQ(mb.size(), static_cast<size_t>(steps)) << b;
  for (int i = 0; i < steps; ++i) {
    EXPECT_EQ(mb[i].at("step"), ma[i].at("step"));
    EXPECT_EQ(mb[i].at("loss").get<double>(), ma[i].at("loss").get<double>()) << "step " << i;
  }
  char name[32];
  std::snprintf(name, sizeof name, "/checkpoints/step-%08d/model.safetensors", steps);
  EXPECT_EQ(file_bytes(a + name), file_bytes(b + name)) << "the final drafters are byte-identical";
}

// ---- checksums -----------------------------------------------------------------

// Restoring a drafter's tensors (resume and eval share it): every kind of
// mismatch is found before anything is copied, and a dtype is converted only
// where the caller allows it.
TEST(CheckpointRestore, MismatchesAreFoundBeforeAnythingIsCopied) {
  const std::map<std::string, torch::Tensor> saved = {{"a", torch::ones({2, 3})}, {"b", torch::full({4}, 7.0)},
                                                      {"map", torch::arange(3, torch::kLong)}};
  torch::Tensor a = torch::zeros({2, 3}), b = torch::zeros({4}), map = torch::zeros({3}, torch::kLong);
  using Kind = checkpoint::TensorMismatch::Kind;
  const torch::Tensor wide = torch::zeros({5});
  const auto shape = checkpoint::first_mismatch(saved, {{"a", a}, {"b", wide}}, false);
  ASSERT_TRUE(shape.has_value());
  EXPECT_EQ(shape->kind, Kind::kShape);
  EXPECT_EQ(shape->name, "b");
  const auto missing = checkpoint::first_mismatch(saved, {{"a", a}, {"c", b}}, false);
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->kind, Kind::kMissing);
  EXPECT_FALSE(missing->saved.defined());
  const torch::Tensor as_float = torch::zeros({3});
  EXPECT_FALSE(checkpoint::first_mismatch(saved, {{"map", as_float}}, false).has_value());  // converted on copy
  const auto dtype = checkpoint::first_mismatch(saved, {{"map", as_float}}, true);
  ASSERT_TRUE(dtype.has_value());
  EXPECT_EQ(dtype->kind, Kind::kDtype);
  EXPECT_EQ(a.sum().item<double>(), 0.0);  // nothing copied by the checks
  ASSERT_FALSE(checkpoint::first_mismatch(saved, {{"a", a}, {"b", b}, {"map", map}}, true).has_value());
  checkpoint::copy_saved(saved, {{"a", a}, {"b", b}, {"map", map}});
  EXPECT_TRUE(torch::equal(a, saved.at("a")));
  EXPECT_TRUE(torch::equal(b, saved.at("b")));
  EXPECT_TRUE(torch::equal(map, saved.at("map")));
}

TEST(Checksum, Xxh64MatchesTheReferenceVectorsInAnyChunking) {
  auto hash = [](const std::string& text, size_t split) {
    hash::Xxh64 h;
    h.update(text.data(), split);
    h.update(text.data() + split, text.size() - split);
    return hash::to_hex(h.digest());
  };
  // Values from the reference implementation (xxhsum -H64).
  EXPECT_EQ(hash("", 0), "ef46db3751d8e999");
  EXPECT_EQ(hash("abc", 1), "44bc2cf5ad770999");
  for (size_t split : {0, 3, 31, 32, 33, 100}) EXPECT_EQ(hash(std::string(100, '\0'), split), "17bb1103c92c502f") << split;
  EXPECT_EQ(hash("Nobody inspects the spammish repetition", 33), "fbcea83c8a378bf1");
}

// ---- 1. one run per output directory ------------------------------------------

TEST(RunDirectory, ASecondRunOnTheSameOutputDirIsRefusedNamingTheHolder) {
  test::TempDir temp("dflash_lock");
  const std::string dir = temp.path().string(), run = dir + "/run";
  ::mkdir(run.c_str(), 0755);
  {
    checkpoint::RunLock held(run);  // another run has it
    Result second = host("--config " + small_config(dir, run, 2), dir);
    EXPECT_EQ(second.status, 1) << second.err;
    EXPECT_CONTAINS(second.err, "train.output_dir " + run + " is in use by another run (pid " + std::to_string(::getpid()));
    EXPECT_CONTAINS(second.err, "give this run another train.output_dir");
    EXPECT_FALSE(exists(run + "/metrics.jsonl")) << "the refused run wrote nothing";
    EXPECT_FALSE(exists(run + "/checkpoints"));
  }
  // A run that died holding the lock leaves its record; the kernel has
  // dropped the flock itself, so the next run takes over and says so.
  std::ofstream(run + "/.dflash-host.lock") << "pid 999999 on host elsewhere since 2026-01-01 00:00:00 UTC\n";
  Result next = host("--config " + small_config(dir, run, 2), dir);
  ASSERT_EQ(next.status, 0) << next.err;
  EXPECT_CONTAINS(next.err, "taking over from a run that ended without releasing it (pid 999999 on host elsewhere");
  EXPECT_EQ(file_bytes(run + "/.dflash-host.lock"), "") << "a run that ends releases its record";
}

// Two real processes started together on one directory: one trains, the
// other is refused; the survivor's metrics and checkpoint are whole.
TEST(RunDirectory, TwoRunsStartedTogetherDoNotInterleave) {
  test::TempDir temp("dflash_lock2");
  const std::string dir = temp.path().string(), run = dir + "/run";
  const std::string config = small_config(dir, run, 40);
  const std::string exe = std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR +
                          " --config " + config;
  const std::string command = "cd " + dir + "; (" + exe + " > /dev/null 2> a.err; echo $? > a.rc) & (" + exe +
                              " > /dev/null 2> b.err; echo $? > b.rc) & wait";
  ASSERT_EQ(std::system(("sh -c '" + command + "'").c_str()), 0);
  const std::string a = file_bytes(dir + "/a.rc"), b = file_bytes(dir + "/b.rc");
  const std::string errors = file_bytes(dir + "/a.err") + file_bytes(dir + "/b.err");
  // Both exit 0 only when one finished before the other started, and then
  // the second found the run done.
  if (a == "0\n" && b == "0\n") {
    EXPECT_CONTAINS(errors, "nothing to do");
  } else {
    EXPECT_TRUE((a == "0\n") != (b == "0\n")) << a << b << errors;
    EXPECT_CONTAINS(errors, "is in use by another run");
  }
  const auto records = metrics_of(run);  // every line parses
  ASSERT_EQ(records.size(), 40u);
  for (size_t i = 0; i < records.size(); ++i) EXPECT_EQ(records[i].at("step"), static_cast<int>(i));
  EXPECT_EQ(latest_of(run), "step-00000040");
}

// ---- 2. a step saved again is swapped in atomically ------------------------------

TEST(Checkpoint, SavingAStepAgainNeverDeletesTheCopyLatestNames) {
  test::TempDir temp("dflash_resave");
  const std::string root = temp.path().string() + "/checkpoints";
  const host::NamedTensors optimizer = {{"step", torch::scalar_tensor(1, torch::kLong)}};
  checkpoint::save(root, 5, {}, {{"w", torch::full({3}, 1.0)}}, optimizer, {{"step", 5}, {"data_state", 1}}, 2);
  checkpoint::save(root, 5, {}, {{"w", torch::full({3}, 2.0)}}, optimizer, {{"step", 5}, {"data_state", 2}}, 2);
  EXPECT_EQ(latest_of(temp.path().string()), "step-00000005");
  const auto loaded = checkpoint::load_latest(root);
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(torch::equal(loaded->weights.at(0).second, torch::full({3}, 2.0))) << "the second save is what stays";
  EXPECT_EQ(loaded->trainer_state.at("data_state"), 2);
  EXPECT_FALSE(exists(root + "/.tmp-step-00000005")) << "the replaced copy is removed after the swap";
  EXPECT_FALSE(exists(root + "/.old-step-00000005"));

  // A crash between moving the old copy aside and renaming the new one in
  // (the path of filesystems without RENAME_EXCHANGE): `latest` names a
  // folder that is gone, and resume restores the new copy.
  ASSERT_EQ(::rename((root + "/step-00000005").c_str(), (root + "/.tmp-step-00000005").c_str()), 0);
  const auto restored = checkpoint::resume_folder(root);
  ASSERT_TRUE(restored);
  EXPECT_EQ(*restored, root + "/step-00000005");
  EXPECT_EQ(checkpoint::load(*restored).trainer_state.at("data_state"), 2);
}

// The issue's reproduction, generalised: the process is killed (SIGKILL, by
// strace's fault injection) at every rename and every unlink a run with a
// checkpoint per step makes, in turn; each killed run is resumed, and every
// resumed run ends bitwise where the uninterrupted one does. That includes
// the kills inside the re-save window (a step whose folder exists because
// the crash came after its rename but before `latest` moved) and inside the
// pruning of old checkpoints.
TEST(CrashSafety, AKillAtEveryRenameAndUnlinkOfTheSavesResumesBitwise) {
  if (std::system("strace -V > /dev/null 2>&1") != 0) GTEST_SKIP() << "strace is not installed (scripts/setup.sh --tests installs it)";
  test::TempDir temp("dflash_strace");
  const std::string dir = temp.path().string();
  const std::string every = " --set train.checkpoint_every=1 --set train.keep_checkpoints=1";
  const int steps = 3;
  Result whole = host("--config " + small_config(dir, dir + "/whole", steps) + every, dir);
  ASSERT_EQ(whole.status, 0) << whole.err;
  int killed = 0;
  for (const std::string syscall : {"rename", "unlink"}) {
    for (int when = 1;; ++when) {
      SCOPED_TRACE(syscall + " #" + std::to_string(when));
      const std::string run = dir + "/" + syscall + std::to_string(when);
      // The kill goes to the thread making the call: the whole process dies.
      const std::string command = "strace -f -qq -o /dev/null -e trace=" + syscall + ",renameat,renameat2,unlinkat -e inject=" +
                                  syscall + ":signal=KILL:when=" + std::to_string(when) + " " + DFLASH_HOST_EXE +
                                  " --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR + " --config " +
                                  small_config(dir, run, steps) + every + " > /dev/null 2>&1";
      const int status = std::system(command.c_str());
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;  // fewer calls than `when`: nothing left to kill
      ++killed;
      Result resumed = host("--config " + small_config(dir, run, steps) + every, dir);
      ASSERT_EQ(resumed.status, 0) << resumed.err;
      expect_same_run(dir + "/whole", run, steps);
      ASSERT_LT(when, 200) << "the fault never stopped firing";
    }
  }
  EXPECT_GE(killed, 8) << "the saves make renames and unlinks to kill at";
  RecordProperty("kills", killed);
  std::printf("killed at %d renames and unlinks; every resume ended bitwise identical\n", killed);
}

// Random SIGKILLs during a run with a checkpoint every step, each followed
// by a resume, until the run completes (bounded to about a minute): the end
// is bitwise the uninterrupted run's. Kills are timed by the run's progress
// (a random 1–6 more steps in metrics.jsonl, then a random 0–15 ms), not by
// the clock, so a loaded machine gives as many kills as an idle one and each
// lands in a step or a checkpoint write.
TEST(CrashSafety, RandomKillsDuringARunThenResumeEndBitwiseIdentical) {
  test::TempDir temp("dflash_kill9");
  const std::string dir = temp.path().string();
  const std::string every = " --set train.checkpoint_every=1 --set train.keep_checkpoints=3";
  const int steps = 60;
  const auto started = std::chrono::steady_clock::now();
  Result whole = host("--config " + small_config(dir, dir + "/whole", steps) + every, dir);
  ASSERT_EQ(whole.status, 0) << whole.err;
  const auto whole_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  const std::string run = dir + "/killed", config = small_config(dir, run, steps);
  const std::string metrics = run + "/metrics.jsonl";
  auto lines = [&] {
    const std::string text = file_bytes(metrics);
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  };
  std::mt19937 rng(14);
  std::uniform_int_distribution<int> more_steps(1, 6), jitter_ms(0, 15);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int kills = 0;
  bool finished = false;
  while (!finished && std::chrono::steady_clock::now() < deadline) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      const std::string set1 = "train.checkpoint_every=1", set2 = "train.keep_checkpoints=3";
      ::execl(DFLASH_HOST_EXE, DFLASH_HOST_EXE, "--no-default-plugin-dirs", "--plugin-dir", DFLASH_INTREE_PLUGIN_DIR,
              "--config", config.c_str(), "--set", set1.c_str(), "--set", set2.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const int target_lines = lines() + more_steps(rng);
    int status = 0;
    pid_t done = 0;
    while ((done = ::waitpid(child, &status, WNOHANG)) == 0 && lines() < target_lines &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (done == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(jitter_ms(rng)));
      done = ::waitpid(child, &status, WNOHANG);
    }
    if (done == child) {
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a run that was not killed succeeds";
      finished = true;
      break;
    }
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    ++kills;
  }
  if (!finished) {  // the minute is up: one last uninterrupted resume
    Result last = host("--config " + config, dir);
    ASSERT_EQ(last.status, 0) << last.err;
  }
  EXPECT_GE(kills, 8) << "the run was interrupted";
  RecordProperty("kills", kills);
  std::printf("%d random kills (runs of %lld ms uninterrupted); the resumed run ended bitwise identical\n", kills,
              static_cast<long long>(whole_ms));
  expect_same_run(dir + "/whole", run, steps);
}

// SIGTERM (a scheduler's time limit, `timeout`) used to kill the run where
// it stood, losing every step since its last checkpoint (the GPU demo lost
// 470 of 1,970). Now the step in progress finishes, a checkpoint of the
// steps done is written, the exit status is 7, and the same command resumes
// to a run bitwise identical to an uninterrupted one.
TEST(CrashSafety, SigtermStopsAfterTheStepWithACheckpointAndTheRunResumesBitwise) {
  test::TempDir temp("dflash_sigterm");
  const std::string dir = temp.path().string();
  const int steps = 16;
  Result whole = host("--config " + small_config(dir, dir + "/whole", steps), dir);
  ASSERT_EQ(whole.status, 0) << whole.err;
  const std::string run = dir + "/stopped", config = small_config(dir, run, steps), err_file = dir + "/stopped.err";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(null, 1);
    ::dup2(err, 2);
    ::execl(DFLASH_HOST_EXE, DFLASH_HOST_EXE, "--no-default-plugin-dirs", "--plugin-dir", DFLASH_INTREE_PLUGIN_DIR,
            "--config", config.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  auto lines = [&] {
    const std::string text = file_bytes(run + "/metrics.jsonl");
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(child, &status, WNOHANG)) == 0 && lines() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(done, 0) << "the run ended before it could be stopped";
  ASSERT_EQ(::kill(child, SIGTERM), 0);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const std::string err = file_bytes(err_file);
  ASSERT_TRUE(WIFEXITED(status)) << "the run handles SIGTERM instead of dying of it\n" << err;
  EXPECT_EQ(WEXITSTATUS(status), 7) << err;
  const int completed = lines();
  ASSERT_GE(completed, 3);
  ASSERT_LT(completed, steps) << "it stopped early";
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", completed);
  EXPECT_EQ(latest_of(run), name) << "the checkpoint holds every completed step";
  EXPECT_NE(err.find("SIGTERM: stopping before step " + std::to_string(completed)), std::string::npos) << err;
  EXPECT_NE(err.find("run the same command to resume"), std::string::npos) << err;
  Result resumed = host("--config " + config, dir);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  expect_same_run(dir + "/whole", run, steps);
}

// --stop-after N at a checkpoint_every step used to save step N twice,
// deleting the copy `latest` named in between.
TEST(CrashSafety, StopAfterAtACheckpointStepSavesItOnce) {
  test::TempDir temp("dflash_stop5");
  const std::string dir = temp.path().string(), run = dir + "/run";
  const std::string command = "strace -f -qq -o " + dir + "/trace -e trace=rename,renameat,renameat2 " + DFLASH_HOST_EXE +
                              " --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR + " --config " +
                              small_config(dir, run, 8) + " --set train.checkpoint_every=2 --stop-after 2 > /dev/null 2>&1";
  if (std::system("strace -V > /dev/null 2>&1") != 0) GTEST_SKIP() << "strace is not installed (scripts/setup.sh --tests installs it)";
  ASSERT_EQ(std::system(command.c_str()), 0);
  const std::string trace = file_bytes(dir + "/trace");
  size_t into_place = 0;
  for (size_t at = 0; (at = trace.find("/.tmp-step-00000002\", ", at)) != std::string::npos; ++at) ++into_place;
  EXPECT_EQ(into_place, 1u) << "step 2 is put in place once:\n" << trace;
  EXPECT_EQ(latest_of(run), "step-00000002");
}

// ---- 3. the output directory itself --------------------------------------------

TEST(RunDirectory, AnEmptyOrRootOutputDirIsRefused) {
  test::TempDir temp("dflash_root");
  const std::string dir = temp.path().string();
  const bool had_metrics = exists("/metrics.jsonl"), had_checkpoints = exists("/checkpoints");
  for (const std::string bad : {"''", "/", "//", "/.", "/./"}) {
    SCOPED_TRACE(bad);
    Result r = host("--config " + small_config(dir, "unused", 2) + " --set train.output_dir=" + bad, dir);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_CONTAINS(r.err, bad == "''" ? "train.output_dir is empty" : "is the filesystem root");
  }
  EXPECT_EQ(exists("/metrics.jsonl"), had_metrics) << "nothing was written into /";
  EXPECT_EQ(exists("/checkpoints"), had_checkpoints);
}

TEST(RunDirectory, ANonUtf8OutputDirIsRefusedBeforeTraining) {
  test::TempDir temp("dflash_utf8");
  const std::string dir = temp.path().string();
  const std::string bad = dir + "/run-\xff\xfe";
  Result r = host("--config " + small_config(dir, "unused", 2) + " --set 'train.output_dir=" + bad + "'", dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_CONTAINS(r.err, "is not valid UTF-8");
  EXPECT_FALSE(exists(bad)) << "refused before anything was created";
}

// ---- 4. a missing `latest` beside step folders ---------------------------------

TEST(CrashSafety, AMissingLatestIsRecoveredFromTheNewestCompleteCheckpoint) {
  test::TempDir temp("dflash_nolatest");
  const std::string dir = temp.path().string(), run = dir + "/run";
  const std::string every = " --set train.checkpoint_every=2 --set train.keep_checkpoints=5";
  ASSERT_EQ(host("--config " + small_config(dir, dir + "/whole", 8) + every, dir).status, 0);
  ASSERT_EQ(host("--config " + small_config(dir, run, 8) + every + " --stop-after 6", dir).status, 0);
  ASSERT_EQ(::unlink((run + "/checkpoints/latest").c_str()), 0);
  Result resumed = host("--config " + small_config(dir, run, 8) + every, dir);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_CONTAINS(resumed.err, "latest was missing beside checkpoint folders; it now names the newest complete one, step-00000006");
  EXPECT_CONTAINS(resumed.err, "resumed from " + run + "/checkpoints/step-00000006");
  expect_same_run(dir + "/whole", run, 8);
  EXPECT_EQ(latest_of(run), "step-00000008");
  EXPECT_TRUE(exists(run + "/checkpoints/step-00000008"));
}

// ---- 6. a metrics write that fails ---------------------------------------------

// Trains the small config (30 steps, plus `settings`) under a file-size
// limit of `blocks`, which fails writes as a full disk would (EFBIG instead
// of ENOSPC); stderr goes through a pipe, which no limit touches. Returns
// {exit status as text, stderr}.
std::pair<std::string, std::string> train_with_file_size_limit(const std::string& dir, const std::string& run,
                                                               int blocks, const std::string& settings) {
  ::mkdir(run.c_str(), 0755);
  const std::string command = "sh -c 'trap \"\" XFSZ; ulimit -f " + std::to_string(blocks) + "; " +
                              std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs --plugin-dir " +
                              DFLASH_INTREE_PLUGIN_DIR + " --config " + small_config(dir, run, 30) + settings +
                              "; echo $? > " + dir + "/rc' 2>&1 >/dev/null | cat > " + dir + "/err";
  EXPECT_EQ(std::system(command.c_str()), 0);
  return {file_bytes(dir + "/rc"), file_bytes(dir + "/err")};
}

TEST(CrashSafety, AFailedMetricsWriteStopsTheRunWithoutATornLine) {
  test::TempDir temp("dflash_fsize");
  const std::string dir = temp.path().string(), run = dir + "/run";
  const auto [rc, err] = train_with_file_size_limit(dir, run, 4, "");
  EXPECT_EQ(rc, "1\n");
  EXPECT_CONTAINS(err, run + "/metrics.jsonl: cannot write (File too large); training stopped at step ");
  EXPECT_CONTAINS(err, "No checkpoint was written yet");
  const auto records = metrics_of(run);  // throws on a torn line
  EXPECT_GT(records.size(), 0u);
  EXPECT_LT(records.size(), 30u);
  const std::string text = file_bytes(run + "/metrics.jsonl");
  EXPECT_EQ(text.back(), '\n') << "the file ends at a whole record";
}

// A full disk during a periodic checkpoint: the message named the phase
// before it, "optimizer step", as if the update had failed.
TEST(CrashSafety, AFullDiskDuringACheckpointIsNamedAsTheSave) {
  test::TempDir temp("dflash_fsize_save");
  const std::string dir = temp.path().string(), run = dir + "/run";
  // 16 blocks hold the first metrics lines, not the drafter's weights.
  const auto [rc, err] = train_with_file_size_limit(dir, run, 16, " --set train.checkpoint_every=2");
  EXPECT_EQ(rc, "1\n");
  EXPECT_CONTAINS(err, "step 1, checkpoint save: ");
  EXPECT_EQ(err.find("optimizer step"), std::string::npos) << err;
  EXPECT_EQ(metrics_of(run).size(), 2u) << "both steps were recorded before the save";
}

// An output folder where checkpoints cannot be written was found only at the
// first save, after steps were trained; it is refused before step 0.
TEST(RunDirectory, AFolderWhereCheckpointsCannotBeWrittenIsRefusedBeforeTraining) {
  test::TempDir temp("dflash_unwritable");
  const std::string dir = temp.path().string(), run = dir + "/run";
  ::mkdir(run.c_str(), 0755);
  std::ofstream(run + "/checkpoints") << "a file where the checkpoints folder goes";
  const Result refused = host("--config " + small_config(dir, run, 6) + " --set train.checkpoint_every=2", dir);
  EXPECT_NE(refused.status, 0) << refused.err;
  EXPECT_CONTAINS(refused.err, run + "/checkpoints: cannot hold checkpoints (Not a directory)");
  EXPECT_CONTAINS(refused.err, "nothing was trained");
  EXPECT_FALSE(exists(run + "/metrics.jsonl") && !file_bytes(run + "/metrics.jsonl").empty()) << "no step ran";
  EXPECT_EQ(file_bytes(run + "/checkpoints"), "a file where the checkpoints folder goes") << "left as it was";
}

// ---- 7. a trainer state is checked before anything acts on it -------------------

TEST(CrashSafety, ACorruptTrainerStateIsRefusedAndTruncatesNothing) {
  test::TempDir temp("dflash_state");
  const std::string dir = temp.path().string(), run = dir + "/run";
  const std::string every = " --set train.checkpoint_every=2 --set train.keep_checkpoints=5";
  ASSERT_EQ(host("--config " + small_config(dir, run, 8) + every + " --stop-after 4", dir).status, 0);
  const std::string state_file = run + "/checkpoints/step-00000004/trainer_state.json";
  const nlohmann::json good = read_json(state_file);
  const std::string metrics_before = file_bytes(run + "/metrics.jsonl");
  struct Case {
    std::string field;
    nlohmann::json value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"step", -5, "trainer_state.json: step is -5, but the folder is step-00000004"},
      {"step", 9, "trainer_state.json: step is 9, but the folder is step-00000004"},
      {"step", "4", "trainer_state.json: step is missing or not an integer"},
      {"nonfinite_steps", -1, "trainer_state.json: nonfinite_steps is -1; expected a count >= 0"},
      {"data_state", nullptr, "trainer_state.json: data_state is missing"},
      {"config", 7, "trainer_state.json: config is 7; expected the run's resolved config"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field + " = " + c.value.dump());
    nlohmann::json bad = good;
    if (c.value.is_null()) bad.erase(c.field);
    else bad[c.field] = c.value;
    write_json(state_file, bad);
    Result r = host("--config " + small_config(dir, run, 8) + every, dir);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_CONTAINS(r.err, c.expected);
    EXPECT_EQ(file_bytes(run + "/metrics.jsonl"), metrics_before) << "nothing truncated";
  }
  // A data position far outside the data is the data source's to refuse.
  nlohmann::json far = good;
  far["data_state"]["index"] = 1000000000;
  write_json(state_file, far);
  Result r = host("--config " + small_config(dir, run, 8) + every, dir);
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.err, "index 1000000000");
  EXPECT_EQ(file_bytes(run + "/metrics.jsonl"), metrics_before);
  write_json(state_file, good);
  ASSERT_EQ(host("--config " + small_config(dir, run, 8) + every, dir).status, 0);
  ASSERT_EQ(host("--config " + small_config(dir, dir + "/whole", 8) + every, dir).status, 0);
  expect_same_run(dir + "/whole", run, 8);
}

// ---- 8. damaged checkpoints ------------------------------------------------------

TEST(CrashSafety, ADamagedCheckpointIsRefusedAndResumeFromAnOlderOneContinues) {
  test::TempDir temp("dflash_damage");
  const std::string dir = temp.path().string(), run = dir + "/run";
  const std::string every = " --set train.checkpoint_every=2 --set train.keep_checkpoints=5";
  ASSERT_EQ(host("--config " + small_config(dir, dir + "/whole", 8) + every, dir).status, 0);
  ASSERT_EQ(host("--config " + small_config(dir, run, 8) + every + " --stop-after 6", dir).status, 0);
  const std::string model = run + "/checkpoints/step-00000006/model.safetensors";
  std::string bytes = file_bytes(model);
  bytes[bytes.size() - 3] ^= 0x10;  // one bit of one weight
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;
  const std::string metrics_before = file_bytes(run + "/metrics.jsonl");
  Result refused = host("--config " + small_config(dir, run, 8) + every, dir);
  EXPECT_EQ(refused.status, 1) << refused.err;
  EXPECT_CONTAINS(refused.err, model + ": checksum XXH64 ");
  EXPECT_CONTAINS(refused.err, "the newest intact checkpoint is step-00000004: resume from it with --resume-from step-00000004");
  EXPECT_EQ(file_bytes(run + "/metrics.jsonl"), metrics_before);

  Result resumed = host("--config " + small_config(dir, run, 8) + every + " --resume-from step-00000004", dir);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_CONTAINS(resumed.err, "moved the newer checkpoint aside to " + run + "/checkpoints/abandoned-step-00000006");
  EXPECT_CONTAINS(resumed.err, "resumed from " + run + "/checkpoints/step-00000004");
  EXPECT_TRUE(exists(run + "/checkpoints/abandoned-step-00000006/model.safetensors")) << "kept, not deleted";
  expect_same_run(dir + "/whole", run, 8);
}

TEST(Checkpoint, NonFiniteWeightsWithMatchingChecksumsAreRefused) {
  test::TempDir temp("dflash_nan");
  const std::string root = temp.path().string() + "/checkpoints";
  const host::NamedTensors optimizer = {{"step", torch::scalar_tensor(1, torch::kLong)}};
  checkpoint::save(root, 2, {}, {{"w", torch::full({3}, 1.0)}}, optimizer, {{"step", 2}, {"data_state", 0}}, 5);
  checkpoint::save(root, 4, {}, {{"w", torch::tensor({1.0, static_cast<double>(NAN), 2.0})}}, optimizer, {{"step", 4}, {"data_state", 0}}, 5);
  EXPECT_EQ(checkpoint::verify(root + "/step-00000004"), "") << "the file is as written";
  try {
    checkpoint::load_latest(root);
    FAIL() << "NaN weights were accepted";
  } catch (const checkpoint::DamagedCheckpoint& e) {
    EXPECT_CONTAINS(e.what(), root + "/step-00000004/model.safetensors: tensor 'w' holds NaN or Inf values");
    EXPECT_CONTAINS(e.what(), "--resume-from step-00000002");
  }
  // A truncated file is caught by its recorded size before anything parses it.
  const std::string model = root + "/step-00000002/model.safetensors";
  const std::string bytes = file_bytes(model);
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  EXPECT_CONTAINS(checkpoint::verify(root + "/step-00000002"), "bytes, but the checkpoint recorded");
  EXPECT_TRUE(checkpoint::intact_checkpoints(root).size() == 1) << "only step 4's files are as written";
}

// A checkpoint tensor relabelled with another dtype of the same size (I32 on
// float bytes), its checksums written to match: resume converted it number
// by number and trained on garbage with exit 0. Weights and optimizer states
// must have the dtype the run keeps; the message names the file and tensor.
TEST(Checkpoint, ATensorOfAnotherDtypeIsRefusedOnResume) {
  test::TempDir temp("dflash_dtype");
  const std::string dir = temp.path().string(), run = dir + "/run", root = run + "/checkpoints";
  ASSERT_EQ(host("--config " + small_config(dir, run, 6) + " --stop-after 2", dir).status, 0);
  const checkpoint::Checkpoint saved = checkpoint::load(root + "/step-00000002");
  const nlohmann::json drafter_config = nlohmann::json::parse(file_bytes(saved.dir + "/config.json"));
  const auto relabelled = [](host::NamedTensors tensors, const std::string& prefix) {
    for (auto& [name, tensor] : tensors)
      if (name.rfind(prefix, 0) == 0 && tensor.scalar_type() == torch::kFloat) {
        tensor = tensor.view(torch::kInt);  // the same bytes under another label
        return std::make_pair(tensors, name);
      }
    ADD_FAILURE() << "no float tensor named " << prefix << "*";
    return std::make_pair(tensors, std::string());
  };
  {
    const auto [weights, name] = relabelled(saved.weights, "");
    checkpoint::save(root, 2, drafter_config, weights, saved.optimizer, saved.trainer_state, 5);
    ASSERT_EQ(checkpoint::verify(saved.dir), "") << "checksums match the altered file";
    const Result refused = host("--config " + small_config(dir, run, 6), dir);
    EXPECT_NE(refused.status, 0) << refused.err;
    EXPECT_CONTAINS(refused.err, saved.dir + "/model.safetensors: '" + name + "' holds Int values where this "
                                 "drafter's parameter is Float");
  }
  {
    const auto [optimizer, name] = relabelled(saved.optimizer, "exp_avg_sq.");
    checkpoint::save(root, 2, drafter_config, saved.weights, optimizer, saved.trainer_state, 5);
    const Result refused = host("--config " + small_config(dir, run, 6), dir);
    EXPECT_NE(refused.status, 0) << refused.err;
    EXPECT_CONTAINS(refused.err, saved.dir + "/optimizer.safetensors: optimizer state: tensor '" + name +
                                 "' holds Int values where the optimizer keeps Float");
  }
  // The files as the run wrote them resume and finish.
  checkpoint::save(root, 2, drafter_config, saved.weights, saved.optimizer, saved.trainer_state, 5);
  const Result resumed = host("--config " + small_config(dir, run, 6), dir);
  EXPECT_EQ(resumed.status, 0) << resumed.err;
}

// ---- 9. a run that trains nothing ------------------------------------------------

// Every line out of the vocabulary and one epoch: the run used to end with
// exit 0 having trained nothing (and with epochs = 0 it spun forever).
TEST(CrashSafety, AllBadDataFailsTheRunAndSavesNothing) {
  test::TempDir temp("dflash_baddata");
  const std::string dir = temp.path().string(), run = dir + "/run";
  {
    std::ofstream data(dir + "/bad.jsonl");
    for (int i = 0; i < 50; ++i) data << "{\"input_ids\": [1, 2, 99999, 3, 4]}\n";
  }
  for (const char* epochs : {"1", "0"}) {
    SCOPED_TRACE(std::string("epochs ") + epochs);
    const nlohmann::json data = {{"plugin", "jsonl"}, {"path", dir + "/bad.jsonl"}, {"row_length", 64},
                                 {"tokens_per_batch", 128}, {"epochs", std::stoi(epochs)}};
    Result r = host("--config " + small_config(dir, run, 4) + " --set 'data=" + data.dump() + "'", dir);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_CONTAINS(r.err, "bad.jsonl");
    EXPECT_FALSE(exists(run + "/checkpoints/latest")) << "nothing was saved";
  }
}

// ---- devices -----------------------------------------------------------------

// train.device "cuda" where there is none died in the target's constructor
// with a raw c10 error when --gpu-memory skipped the capacity query.
TEST(Devices, ACudaDeviceThisMachineLacksIsRefusedBeforeThePluginsLoad) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a CUDA device";
  test::TempDir temp("dflash_nocuda");
  const std::string dir = temp.path().string();
  Result r = host("--config " + small_config(dir, dir + "/run", 2) + " --set train.device=cuda --gpu-memory 80GiB", dir);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "train.device \"cuda\": this dflash-host was built without CUDA");
  EXPECT_EQ(r.err.find("c10"), std::string::npos) << r.err;
  EXPECT_FALSE(exists(dir + "/run")) << "refused before anything was created";
}

// ---- resuming with other settings -----------------------------------------------

TEST(CrashSafety, ResumingWithSettingsThatShapeTheRunChangedIsRefused) {
  test::TempDir temp("dflash_change");
  const std::string dir = temp.path().string(), run = dir + "/run";
  ASSERT_EQ(host("--config " + small_config(dir, run, 6) + " --stop-after 2", dir).status, 0);
  // The checkpoint records the libraries the run trained with.
  const auto state = nlohmann::json::parse(test::file_bytes(run + "/checkpoints/step-00000002/trainer_state.json"));
  for (const char* section : {"data", "target", "drafter", "loss", "scheduler"}) {
    const auto& plugin = state.at("plugins").at(section);
    EXPECT_EQ(plugin.at("kind"), section);
    EXPECT_EQ(plugin.at("xxh64").get<std::string>().size(), 16u) << plugin;
    EXPECT_FALSE(plugin.at("version").get<std::string>().empty()) << plugin;
  }
  EXPECT_EQ(state.at("plugins").at("loss").at("name"), "fused_ckpt_kl");
  Result seed = host("--config " + small_config(dir, run, 6) +
                         " --set train.seed=4 --set data.tokens_per_batch=256 --set train.log_every=3",
                     dir);
  EXPECT_EQ(seed.status, 2) << seed.err;
  EXPECT_CONTAINS(seed.err, "in what shapes it (settings, plugins, their versions):");
  EXPECT_CONTAINS(seed.err, "train.seed: 3 → 4");
  EXPECT_CONTAINS(seed.err, "data.tokens_per_batch: 128 → 256");
  EXPECT_CONTAINS(seed.err, "these changes would be allowed (they do not change what it computes):\n  train.log_every: ");
  EXPECT_CONTAINS(seed.err, "--allow-config-change");
  // Another loss plugin is another run.
  Result other_loss = host("--config " + small_config(dir, run, 6, {{"plugin", "kl"}, {"kl_weight", 0.5}}), dir);
  EXPECT_EQ(other_loss.status, 2) << other_loss.err;
  EXPECT_CONTAINS(other_loss.err, "loss plugin: 'fused_ckpt_kl' → 'kl'");
  // Logging, evaluation and the length of the run may change, and are said to.
  Result longer = host("--config " + small_config(dir, run, 7) + " --set train.log_every=3 --stop-after 1", dir);
  EXPECT_EQ(longer.status, 0) << longer.err;
  EXPECT_CONTAINS(longer.err, "resuming with changes that do not alter what it computes:\n  train.log_every: ");
  Result forced = host("--config " + small_config(dir, run, 7) + " --set train.seed=4 --allow-config-change", dir);
  EXPECT_EQ(forced.status, 0) << forced.err;
  EXPECT_CONTAINS(forced.err, "resuming with changes that shape the run (--allow-config-change):");
  EXPECT_CONTAINS(forced.err, "train.seed: 3 → 4");
}

TEST(ResumeState, AnotherPluginVersionIsRefusedTheSameVersionRebuiltIsAllowed) {
  const nlohmann::json kl = {{"kind", "loss"}, {"name", "kl"}, {"version", "1.0.0"}, {"file", "/p/libkl.so"},
                             {"xxh64", "0123456789abcdef"}};
  const nlohmann::json saved = {{"config", {{"train", {{"seed", 3}}}}}, {"plugins", {{"loss", kl}}}};
  nlohmann::json rebuilt = kl;
  rebuilt["xxh64"] = "fedcba9876543210";
  auto changes = train::resume_changes(saved, saved.at("config"), {{"loss", rebuilt}});
  EXPECT_TRUE(changes.refused.empty());
  ASSERT_EQ(changes.allowed.size(), 1u);
  EXPECT_EQ(changes.allowed[0], "loss plugin 'kl': library rebuilt at the same version 1.0.0 (xxh64 0123456789abcdef → "
                                "fedcba9876543210, /p/libkl.so)");
  nlohmann::json newer = rebuilt;
  newer["version"] = "1.1.0";
  changes = train::resume_changes(saved, saved.at("config"), {{"loss", newer}});
  ASSERT_EQ(changes.refused.size(), 1u);
  EXPECT_EQ(changes.refused[0], "loss plugin 'kl': version 1.0.0 → 1.1.0 (/p/libkl.so)");
  EXPECT_TRUE(train::resume_changes(saved, saved.at("config"), {{"loss", kl}}).refused.empty());
  // A checkpoint written before plugins were recorded compares its config only.
  EXPECT_TRUE(train::resume_changes({{"config", saved.at("config")}}, saved.at("config"), {{"loss", newer}}).refused.empty());
}

TEST(ResumeState, ConfigChangesListOnlyTheSettingsThatShapeTheRun) {
  const nlohmann::json saved = {{"train", {{"seed", 3}, {"steps", 10}, {"log_every", 1}}}, {"data", {{"path", "a"}}}};
  nlohmann::json now = saved;
  EXPECT_TRUE(train::config_changes(saved, now).empty());
  now["train"]["steps"] = 20;
  now["train"]["log_every"] = 5;
  EXPECT_TRUE(train::config_changes(saved, now).empty());
  now["data"]["path"] = "b";
  now["data"]["epochs"] = 1;
  now["train"].erase("seed");
  const auto changes = train::config_changes(saved, now);
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0], "data.epochs: (unset) → 1");
  EXPECT_EQ(changes[1], "data.path: \"a\" → \"b\"");
  EXPECT_EQ(changes[2], "train.seed: 3 → (unset)");
}

}  // namespace
