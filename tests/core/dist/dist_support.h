// What the multi-process tests share: the small data-parallel config, the
// launcher (in the foreground and in the background), and the comparison of
// two checkpoints' drafters.
#pragma once

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
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <string>
#include <thread>

namespace dflash::test {

namespace fs = std::filesystem;

// Where these tests put their ranks. Unset: on the CPU, through Gloo (CI).
// DFLASH_TEST_DIST_DEVICE=cuda: one GPU per rank, through NCCL, and the
// one-process references on cuda:0 (issue 19, on a machine of several GPUs:
// scripts/device/multi_gpu.sh). Every run of these tests goes through
// run_alone, one_process, launched or launch_in_background, which add the
// device.
inline bool ranks_on_gpus() {
  const char* device = std::getenv("DFLASH_TEST_DIST_DEVICE");
  return device != nullptr && std::string(device) == "cuda";
}

// (`launch` then gives rank r the device cuda:r.)
inline std::string device_flag() { return ranks_on_gpus() ? " --set train.device=cuda" : ""; }

// Whether `ranks` processes can run here: always on the CPU; on GPUs, one
// device each.
inline bool enough_devices(int ranks) {
  return !ranks_on_gpus() || static_cast<int>(torch::cuda::device_count()) >= ranks;
}

// The same inside a test that tries several world sizes: false, with a line
// naming the case it leaves out, where this machine has too few GPUs for it.
inline bool runs_here(int ranks, const std::string& what) {
  if (enough_devices(ranks)) return true;
  std::cout << "[ skipped  ] " << what << ": " << ranks << " ranks, " << torch::cuda::device_count() << " GPUs here\n";
  return false;
}

#define DFLASH_DIST_SKIP_UNLESS_RANKS(n)                                                                   \
  if (!::dflash::test::enough_devices(n))                                                                  \
  GTEST_SKIP() << (n) << " ranks need " << (n) << " GPUs; this machine has " << torch::cuda::device_count()

// The tests of two or more ranks: on the CPU they need Gloo (Debian's
// LibTorch has its headers; the GPU machine's torch wheel does not); on GPUs
// (DFLASH_TEST_DIST_DEVICE=cuda) NCCL and two devices.
class TwoRanks : public ::testing::Test {
 protected:
  void SetUp() override {
#if !DFLASH_TEST_HAVE_GLOO
    if (!ranks_on_gpus()) GTEST_SKIP() << "this build has no Gloo (DFLASH_TEST_DIST_DEVICE=cuda: NCCL on GPUs)";
#endif
    DFLASH_DIST_SKIP_UNLESS_RANKS(2);
  }
};

// The tolerance two runs are compared with: `cpu` on the CPU, where only the
// order of a few sums differs; on GPUs at least 1e-4 relative, as cuBLAS,
// NCCL's rings and atomic adds order the fp32 sums differently from run to
// run (issue 19 allows bf16's 2⁻⁸; 1e-4 still sees a lost micro-batch).
inline double across_runs(double cpu) { return ranks_on_gpus() ? std::max(cpu, 1e-4) : cpu; }

// The small run (train/run_support.h) with a global batch of 6 data-source
// batches: 6 micro-batches on one process, 3 per rank on two, 2 on three.
inline std::string dp_config(const std::string& dir, const std::string& output, int steps, const std::string& name = "config") {
  const std::string path = test::small_config(dir, output, steps);
  nlohmann::json config = nlohmann::json::parse(file_bytes(path));
  config["train"]["grad_accumulation"] = 6;
  config["train"]["collective_timeout_s"] = 60;
  // AdamW's ε at its default (1e-8) turns the summation-order difference of
  // an element whose gradient cancels to about ε (~1e-10 absolute) into a
  // parameter difference of ~lr/10: one element in 10⁴ then differed by 2e-6
  // and lifted its tensor to 1.2e-6 relative. At 1e-6 the update is linear
  // in such gradients, so the comparison measures the engine (a lost or
  // doubly counted micro-batch changes every gradient, not one element's
  // last bits), not that
  // amplification.
  config["train"]["adam_eps"] = 1e-6;
  const std::string mine = dir + "/" + name + ".json";
  std::ofstream(mine) << config.dump(2);
  return mine;
}

// One process without the launcher, on the tests' device.
inline Result run_alone(const std::string& args, const std::string& scratch) {
  return host(args + device_flag(), scratch);
}

// The one-process reference run with one thread, as each rank has under the
// launcher (and torchrun): `launch` sets OMP_NUM_THREADS=1. On some
// OpenBLAS cores (Haswell's, not SkylakeX's) the threaded products split
// their sums among threads, so a two-thread reference differed from the
// ranks by 1.16e-6 where the engine itself differs by less.
inline Result one_process(const std::string& args, const std::string& scratch) {
  const char* before = std::getenv("OMP_NUM_THREADS");
  const std::string saved = before ? before : "";
  ::setenv("OMP_NUM_THREADS", "1", 1);
  Result result = run_alone(args, scratch);
  if (before) ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else ::unsetenv("OMP_NUM_THREADS");
  return result;
}

inline std::map<std::string, at::Tensor> weights_of(const std::string& checkpoint) {
  auto file = sdk::safetensors::File::open(checkpoint + "/model.safetensors");
  std::map<std::string, at::Tensor> out;
  for (const auto& info : file->tensors()) out[info.name] = sdk::safetensors::load_tensor(file, info).to(at::kDouble);
  return out;
}

// The relative error of each tensor, ‖a − b‖₂ / ‖b‖₂; the largest over the
// drafter. (Summed in another order, fp32 gradients differ in their last
// bits; elements near zero then differ by more than 1e-6 of themselves,
// tensors do not.)
inline double largest_relative_difference(const std::string& a, const std::string& b) {
  const auto wa = weights_of(a), wb = weights_of(b);
  EXPECT_EQ(wa.size(), wb.size());
  double worst = 0;
  for (const auto& [name, tb] : wb) {
    const auto it = wa.find(name);
    if (it == wa.end()) {
      ADD_FAILURE() << name << " is missing from " << a;
      continue;
    }
    worst = std::max(worst, (it->second - tb).norm().item<double>() / std::max(1e-30, tb.norm().item<double>()));
  }
  return worst;
}

// The run secret of the tests that start ranks by hand, as a user of
// torchrun exports one (`dflash-host launch` makes its own).
inline constexpr const char* kTestRunSecret = "0123456789abcdef0123456789abcdef-test-run";

// `dflash-host launch --nproc-per-node N -- <the test's plugin folders> ARGS`.
inline Result launched(int ranks, const std::string& args, const std::string& scratch) {
  const std::string err_file = scratch + "/stderr.txt";
  const std::string command = std::string(DFLASH_HOST_EXE) + " launch --nproc-per-node " + std::to_string(ranks) +
                              " -- --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR + " --plugin-dir " +
                              DFLASH_GOOD_PLUGIN_DIR + " " + args + device_flag() +
                              " > /dev/null 2>" + err_file;
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, file_bytes(err_file)};
}

// Two ranks under the launcher in the background, with its log in
// `err_file`; once `checkpoint` exists, rank 1's pid (from the launcher's
// log). pid 0: it never came.
struct Background {
  pid_t launcher = -1, rank1 = 0, rank0 = 0;
};
inline Background launch_in_background(const std::string& launcher_flags, const std::string& args, const std::string& err_file,
                                       const std::string& checkpoint, int ranks = 2) {
  Background b;
  b.launcher = ::fork();
  if (b.launcher == 0) {
    const std::string command = std::string(DFLASH_HOST_EXE) + " launch --nproc-per-node " + std::to_string(ranks) + " " + launcher_flags +
                                " -- --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR + " --plugin-dir " +
                                DFLASH_GOOD_PLUGIN_DIR + " " + args + device_flag() +
                                " > /dev/null 2> " + err_file;
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto start = std::chrono::steady_clock::now();
  while (b.launcher > 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(120)) {
    std::smatch m;
    const std::string log = file_bytes(err_file);
    if (b.rank1 == 0 && std::regex_search(log, m, std::regex("rank 1 is pid ([0-9]+)"))) b.rank1 = std::stoi(m[1]);
    if (b.rank0 == 0 && std::regex_search(log, m, std::regex("rank 0 is pid ([0-9]+)"))) b.rank0 = std::stoi(m[1]);
    if (b.rank1 != 0 && fs::exists(checkpoint)) return b;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  b.rank1 = 0;
  return b;
}

// Sends `signal` to `pid` and waits for the launcher to end. exit_status:
// the launcher's, or -1 when it did not exit (or the signal could not be
// sent: a failure is added); seconds: from the signal to its end.
struct Ended {
  int exit_status = -1;
  double seconds = 0;
};
inline Ended signal_and_wait(pid_t pid, int signal, pid_t launcher) {
  Ended e;
  if (::kill(pid, signal) != 0) {
    ADD_FAILURE() << "could not signal pid " << pid;
    return e;
  }
  const auto sent = std::chrono::steady_clock::now();
  int status = 0;
  if (::waitpid(launcher, &status, 0) != launcher) {
    ADD_FAILURE() << "the launcher (pid " << launcher << ") could not be waited for";
    return e;
  }
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  if (WIFEXITED(status)) e.exit_status = WEXITSTATUS(status);
  return e;
}

// The newest checkpoint of `checkpoints` (the folder its "latest" names) and
// its step; step -1 (and a failure) when there is none.
struct Latest {
  std::string name;
  int64_t step = -1;
};
inline Latest latest_checkpoint(const std::string& checkpoints) {
  Latest l;
  l.name = file_bytes(checkpoints + "/latest");
  l.name = l.name.substr(0, l.name.find('\n'));
  if (l.name.rfind("step-", 0) != 0) {
    ADD_FAILURE() << checkpoints << "/latest does not name a step: '" << l.name << "'";
    return l;
  }
  l.step = std::stoll(l.name.substr(5));
  return l;
}

}  // namespace dflash::test
