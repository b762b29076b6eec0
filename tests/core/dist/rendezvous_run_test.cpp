// The rendezvous store of a real run (`dflash-host launch`, two ranks on the
// CPU through Gloo) against an outsider on the same machine: the probe of
// issue 40 found c10d's TCPStore open on every interface to anyone, and
// frozen for every rank by one client that sent a byte and held its socket.
// Ranks started by hand: one with another secret, one with none.
#include "dist/collective.h"
#include "core/dist/dist_support.h"
#include "dist/rendezvous/store_client.h"
#include "support/expect.h"
#include "support/free_port.h"
#include "support/temp_dir.h"
#include "core/train/run_support.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

namespace dflash {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace rdv = dist::rendezvous;
namespace fs = std::filesystem;
using test::file_bytes;

// A TCP connection to `at`, or -1 while nothing listens there.
int connect_to(const rdv::Endpoint& at) {
  const int fd = ::socket(at.address.ss_family, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&at.address), at.length) == 0) return fd;
  ::close(fd);
  return -1;
}

class RunStore : public test::TwoRanks {};

// The launcher with `flags`, to its end; its wall time in seconds, or -1
// (and the launcher killed) past `limit`.
double launch_and_time(const std::string& flags, const std::string& args, const std::string& err_file, std::chrono::seconds limit,
                       int* status_out) {
  const auto started = Clock::now();
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    const std::string command = std::string(DFLASH_HOST_EXE) + " launch --nproc-per-node 2 " + flags +
                                " -- --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR + " " + args +
                                test::device_flag() + " > /dev/null 2> " + err_file;
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(launcher, &status, WNOHANG) == 0) {
    if (Clock::now() - started > limit) {
      ::kill(launcher, SIGTERM);
      ::waitpid(launcher, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(50ms);
  }
  *status_out = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return std::chrono::duration<double>(Clock::now() - started).count();
}

TEST_F(RunStore, AnOutsiderCanNeitherReadNorWriteItsKeysNorReachItElsewhereAndAHalfOpenClientDelaysNoStep) {
  test::TempDir temp("dflash_run_store");
  const std::string dir = temp.path().string();
  const int steps = 60;  // long enough for the outsiders to try everything while the run lasts
  int status = -1;
  // The same run undisturbed, for its time.
  const double undisturbed = launch_and_time("", "--config " + test::dp_config(dir, dir + "/quiet", steps, "quiet"),
                                             dir + "/quiet.txt", 600s, &status);
  ASSERT_EQ(status, 0) << file_bytes(dir + "/quiet.txt");

  // This test knows the run's secret (an insider, to look inside the store
  // afterwards); the outsiders do not.
  const rdv::RunSecret secret = rdv::RunSecret::from_text(test::kTestRunSecret, "the test's secret");
  ::setenv(rdv::kSecretVariable, test::kTestRunSecret, 1);
  const int port = test::free_loopback_port();
  const rdv::Endpoint store = rdv::resolve("127.0.0.1", port);
  std::atomic<bool> done{false};
  std::string outsider_error, insider_error, elsewhere;
  bool outsider_served = false, tcpstore_closed = false, half_open_held = false, insider_looked = false, outsider_key_found = false;
  std::thread outsiders([&] {
    // One byte of a request, then the socket held until the run ends.
    int half_open = -1;
    while (!done && (half_open = connect_to(store)) < 0) std::this_thread::sleep_for(5ms);
    if (half_open < 0) return;
    half_open_held = ::send(half_open, "\x01", 1, MSG_NOSIGNAL) == 1;
    // Another run's secret: refused, having read nothing.
    try {
      rdv::StoreClient outsider(store, rdv::RunSecret::generate(), 10s);
      outsider.set(dist::failure_key(1), "written by an outsider", 10s);
      outsider_served = true;
    } catch (const std::exception& e) {
      outsider_error = e.what();
    }
    // The bytes c10d's TCPStore client opens with (a query type and its
    // 4-byte magic), then a set of dflash/failed/1 in its format: the store
    // closes the connection without a word. (c10d's client itself is not
    // used here: its listener thread dies of the store's greeting, taking
    // its process with it.)
    const int tcpstore = connect_to(store);
    if (tcpstore >= 0) {
      std::string query = std::string("\x00\x3c\x85\x00\x00", 5) + std::string("\x00", 1);
      const std::string key = dist::failure_key(1);
      const uint64_t n = key.size();
      query += std::string(reinterpret_cast<const char*>(&n), 8) + key;
      ::send(tcpstore, query.data(), query.size(), MSG_NOSIGNAL);
      char buffer[256];
      const auto until = Clock::now() + 3s;
      tcpstore_closed = false;
      while (Clock::now() < until && !tcpstore_closed) {
        pollfd p{tcpstore, POLLIN, 0};
        if (::poll(&p, 1, 50) > 0 && ::recv(tcpstore, buffer, sizeof buffer, 0) <= 0) tcpstore_closed = true;
      }
      ::close(tcpstore);
    }
    // Nothing they tried to write is there (asked by a client with the secret, while the run lasts).
    try {
      rdv::StoreClient insider(store, secret, 10s);
      outsider_key_found = insider.check({dist::failure_key(1)}, 10s);
      insider_looked = true;
    } catch (const std::exception& e) {
      insider_error = e.what();
    }
    // This host's other addresses do not reach the store.
    ifaddrs* all = nullptr;
    if (::getifaddrs(&all) == 0) {
      for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
        rdv::Endpoint other;
        std::memcpy(&other.address, i->ifa_addr, sizeof(sockaddr_in));
        other.length = sizeof(sockaddr_in);
        reinterpret_cast<sockaddr_in&>(other.address).sin_port = htons(static_cast<uint16_t>(port));
        if (other.is_loopback()) continue;
        const int fd = connect_to(other);
        if (fd >= 0) elsewhere += other.text() + " ", ::close(fd);
      }
      ::freeifaddrs(all);
    }
    while (!done) std::this_thread::sleep_for(20ms);
    ::close(half_open);
  });
  const std::string config = test::dp_config(dir, dir + "/attacked", steps, "attacked");
  const double attacked = launch_and_time("--master-port " + std::to_string(port), "--config " + config, dir + "/attacked.txt",
                                          std::chrono::seconds(static_cast<int64_t>(undisturbed * 3 + 60)), &status);
  done = true;
  outsiders.join();
  ::unsetenv(rdv::kSecretVariable);
  const std::string log = file_bytes(dir + "/attacked.txt");
  ASSERT_GT(attacked, 0) << "the run did not end within 3× its undisturbed time + 60 s: the store was stalled\n" << log;
  EXPECT_EQ(status, 0) << log;
  EXPECT_TRUE(half_open_held) << "the half-open client never reached the store";
  EXPECT_FALSE(outsider_served) << "a client with another secret wrote a key";
  EXPECT_CONTAINS(outsider_error, "refused this rank");
  EXPECT_TRUE(tcpstore_closed) << "a client speaking c10d's TCPStore protocol was not closed within 3 s";
  ASSERT_TRUE(insider_looked) << "the run ended before the test could look into its store: " << insider_error;
  EXPECT_FALSE(outsider_key_found) << "an outsider's key is in the run's store";
  EXPECT_EQ(elsewhere, "") << "the store answered on an address other than MASTER_ADDR's";
  EXPECT_CONTAINS(log, "rendezvous store: ");  // the refusals and the drop are logged
  EXPECT_EQ(log.find(test::kTestRunSecret), std::string::npos) << "the log quotes the secret";
  EXPECT_EQ(log.find("written by an outsider"), std::string::npos);
  // A half-open client no longer holds the run: it ends in about its undisturbed time.
  EXPECT_LT(attacked, undisturbed * 1.5 + 10) << "undisturbed " << undisturbed << " s\n" << log;
  std::cout << "[ note     ] undisturbed " << undisturbed << " s, with the outsiders " << attacked << " s\n";
}

// Rank 0 stopped (SIGSTOP): the store it serves stalls with it. Rank 1's
// collective times out, and its diagnosis, whose reads of the store wait at
// most collective_timeout_s, names the store and rank 0 rather than waiting
// on it.
TEST_F(RunStore, AStalledStoreIsReportedByNameWithinTheTimeout) {
  test::TempDir temp("dflash_run_stall");
  const std::string dir = temp.path().string();
  const std::string config = test::dp_config(dir, dir + "/run", 400);
  const std::string err_file = dir + "/launch.txt";
  const test::Background run = test::launch_in_background(
      "--stop-grace-s 1", "--config " + config + " --set train.checkpoint_every=2 --set train.collective_timeout_s=4", err_file,
      dir + "/run/checkpoints/step-00000002");
  ASSERT_GT(run.launcher, 0);
  ASSERT_NE(run.rank0, 0) << file_bytes(err_file);
  const test::Ended ended = test::signal_and_wait(run.rank0, SIGSTOP, run.launcher);
  const std::string log = file_bytes(err_file);
  EXPECT_NE(ended.exit_status, 0) << log;
  EXPECT_CONTAINS(log, "rank 1: ");
  EXPECT_CONTAINS(log, "the rendezvous store at 127.0.0.1:");
  EXPECT_CONTAINS(log, "so rank 0 (which serves it) has exited or is stopped");
  // The collective's 4 s, the diagnosis's reads (at most 4 s), the rank's
  // exit (its heartbeat's last write: at most 2 s), the launcher's 1 s of
  // grace, and rank 0's own end once it runs again (its collective fails
  // and it diagnoses rank 1: 2.5 s), with room for a loaded machine.
  EXPECT_LT(ended.seconds, 4 + 4 + 2 + 1 + 3 + 15) << log;
  std::cout << "[ note     ] ended " << ended.seconds << " s after rank 0 stopped\n";
}

// Under torchrun's agent store (its TCPStore at MASTER_ADDR:MASTER_PORT,
// served here by the test as torchrun's agent would): rank 0 serves the
// run's store elsewhere and signs its address there; a rank refuses an
// address that is not signed with its secret.
TEST_F(RunStore, UnderTorchrunsAgentStoreTheRanksMeetAtASignedAddressAndRefuseAnother) {
  test::TempDir temp("dflash_run_agent");
  const std::string dir = temp.path().string();
  const int port = test::free_loopback_port();
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = 30s;
  c10d::TCPStore agent("127.0.0.1", options);
  const std::string config = test::dp_config(dir, dir + "/run", 2);
  const std::string base = std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR +
                           " --config " + config + " --set train.collective_timeout_s=10" + test::device_flag();
  auto rank = [&](int r, int attempt) {
    return "(RANK=" + std::to_string(r) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=" + std::to_string(attempt) +
           " DFLASH_RUN_SECRET=" + test::kTestRunSecret + " OMP_NUM_THREADS=1 " + base + " > /dev/null 2> " + dir + "/err" +
           std::to_string(attempt) + "_" + std::to_string(r) + ".txt; echo $? > " + dir + "/status" + std::to_string(attempt) + "_" +
           std::to_string(r) + ") & ";
  };
  // Attempt 0: someone else wrote an address for the run (signed with another secret).
  const auto forger = rdv::RunSecret::generate();
  const std::string where = "127.0.0.1 " + std::to_string(port);
  const std::string forged = where + " " + rdv::to_hex(forger.prove("dflash rendezvous address", where));
  agent.set("/worker/attempt_0/dflash/rendezvous_store", std::vector<uint8_t>(forged.begin(), forged.end()));
  ASSERT_EQ(std::system(("bash -c '" + rank(1, 0) + "wait'").c_str()), 0);
  EXPECT_NE(file_bytes(dir + "/status0_1"), "0\n");
  EXPECT_CONTAINS(file_bytes(dir + "/err0_1.txt"), "is not signed with this rank's run secret");
  // Attempt 1: both ranks, through the agent's store, to the end of the run.
  ASSERT_EQ(std::system(("bash -c '" + rank(0, 1) + rank(1, 1) + "wait'").c_str()), 0);
  const std::string err0 = file_bytes(dir + "/err1_0.txt");
  EXPECT_EQ(file_bytes(dir + "/status1_0"), "0\n") << err0;
  EXPECT_EQ(file_bytes(dir + "/status1_1"), "0\n") << file_bytes(dir + "/err1_1.txt");
  EXPECT_CONTAINS(err0, "serving the run's rendezvous store at 127.0.0.1:");
  EXPECT_CONTAINS(err0, "(its address signed in torchrun's store)");
  EXPECT_EQ(err0.find("127.0.0.1:" + std::to_string(port) + " to the ranks"), std::string::npos)
      << "rank 0 serves the run's store on a port of its own, not torchrun's";
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints/step-00000002")) << err0;
}

// Ranks started by hand (the torchrun variables) whose secrets differ: the
// store refuses rank 1 and says which variable to set; rank 0 names rank 1
// as the one that did not join.
TEST_F(RunStore, ARankWithAnotherSecretIsRefusedAndOneWithoutIsToldHowToGetOne) {
  test::TempDir temp("dflash_run_secret");
  const std::string dir = temp.path().string();
  const std::string config = test::dp_config(dir, dir + "/run", 2);
  const std::string base = std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR +
                           " --config " + config + " --set train.collective_timeout_s=5" + test::device_flag();
  const int port = test::free_loopback_port();
  const std::string secrets[2] = {test::kTestRunSecret, "another-secret-of-32-characters-or-more"};
  std::string script;
  for (int r = 0; r < 2; ++r)
    script += "(RANK=" + std::to_string(r) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
              " DFLASH_RUN_SECRET=" + secrets[r] + " " + base + " > /dev/null 2> " + dir + "/err" + std::to_string(r) +
              ".txt; echo $? > " + dir + "/status" + std::to_string(r) + ") & ";
  script += "wait";
  ASSERT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0);
  const std::string err0 = file_bytes(dir + "/err0.txt"), err1 = file_bytes(dir + "/err1.txt");
  EXPECT_NE(file_bytes(dir + "/status1"), "0\n") << err1;
  EXPECT_CONTAINS(err1, "rank 1: the rendezvous store at 127.0.0.1:" + std::to_string(port) + " refused this rank");
  EXPECT_CONTAINS(err1, "the same $DFLASH_RUN_SECRET as rank 0");
  EXPECT_NE(file_bytes(dir + "/status0"), "0\n") << err0;
  EXPECT_CONTAINS(err0, "rank 1 did not join the run");
  EXPECT_CONTAINS(err0, "refused the client at 127.0.0.1:");
  for (const auto& s : secrets) {
    EXPECT_EQ(err0.find(s), std::string::npos) << "rank 0's log quotes a secret";
    EXPECT_EQ(err1.find(s), std::string::npos) << "rank 1's log quotes a secret";
  }
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl")) << "nothing trained";

  // No secret at all: refused before anything starts, saying how to give one.
  const std::string alone = "env -u DFLASH_RUN_SECRET -u DFLASH_RUN_SECRET_FILE RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                            std::to_string(port) + " " + base + " > /dev/null 2> " + dir + "/none.txt";
  const int none = std::system(alone.c_str());
  EXPECT_EQ(WEXITSTATUS(none), 2);
  EXPECT_CONTAINS(file_bytes(dir + "/none.txt"), "$DFLASH_RUN_SECRET is not set");
  EXPECT_CONTAINS(file_bytes(dir + "/none.txt"), "openssl rand -hex 32");
}

}  // namespace
}  // namespace dflash
