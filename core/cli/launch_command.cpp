// `dflash-host launch --nproc-per-node N [--master-port P] [--] ARGS…`:
// starts N ranks of `dflash-host ARGS…` on this machine with the torchrun
// environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) and a secret of the run's own ($DFLASH_RUN_SECRET, made
// here unless its environment has one: the ranks prove it to the rendezvous
// store), for users without Python. It forwards SIGINT and SIGTERM to
// the ranks, waits for them all, and when one fails gives the others
// --stop-grace-s to stop on their own (they name the failed rank) before it
// stops them. Its exit status is the first failing rank's, except that a
// specific status (not the generic 1: a usage error, out of memory, …) of a
// rank that ended on its own wins over the generic failures of ranks that
// may only have noticed it first (a rank whose peer exits can fail before
// the peer's own exit is seen).
#include "cli/commands.h"
#include "dist/process_group.h"
#include "dist/rendezvous/run_secret.h"
#include "log/log.h"

#include <boost/dll/runtime_symbol_info.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dflash::cli {
namespace {

struct LaunchOptions {
  int nproc = 1;
  int master_port = 0;  // 0: a free port
  std::string master_addr = "127.0.0.1";
  double stop_grace_s = 30;
  std::vector<std::string> arguments;  // the ranks' command line
};

const char* const kLaunchUsage =
    "usage: dflash-host launch --nproc-per-node N [--master-port P] [--master-addr A] [--stop-grace-s S] [--] ARGS...\n"
    "  starts N ranks of `dflash-host ARGS...` on this machine, as torchrun --no-python would\n";

int whole(const std::string& flag, const std::string& text, int least, int most) {
  const std::optional<int> value = dist::parse_bounded_int(text, least, most);
  if (!value)
    throw std::invalid_argument(flag + " " + text + ": expected a whole number from " + std::to_string(least) + " to " +
                                std::to_string(most));
  return *value;
}

LaunchOptions parse_launch(int argc, char** argv) {
  LaunchOptions o;
  bool have_nproc = false;
  int i = 2;
  auto value = [&](const std::string& flag) {
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    return std::string(argv[++i]);
  };
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--nproc-per-node" || a == "--nproc_per_node") {
      o.nproc = whole(a, value(a), 1, 1024);
      have_nproc = true;
    } else if (a == "--master-port" || a == "--master_port") {
      o.master_port = whole(a, value(a), 1, 65535);
    } else if (a == "--master-addr" || a == "--master_addr") {
      o.master_addr = value(a);
    } else if (a == "--stop-grace-s") {
      o.stop_grace_s = whole(a, value(a), 0, 86400);
    } else if (a == "--help" || a == "-h") {
      std::cout << kLaunchUsage;
      std::exit(kExitOk);
    } else {
      break;  // the ranks' arguments begin
    }
  }
  for (; i < argc; ++i) o.arguments.emplace_back(argv[i]);
  if (!have_nproc) throw std::invalid_argument(std::string("launch needs --nproc-per-node N\n") + kLaunchUsage);
  if (!o.arguments.empty() && o.arguments.front() == "launch")
    throw std::invalid_argument("launch: the ranks' command is itself `launch`; give the training arguments");
  return o;
}

// A port nothing listens on now (the kernel's choice), for rank 0's store.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("launch: socket(): ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw std::runtime_error("launch: no free port on 127.0.0.1 (" + why + "); give --master-port");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

volatile sig_atomic_t g_forward = 0;
void remember_signal(int sig) { g_forward = sig; }

std::string exit_text(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "status " + std::to_string(status);
}
int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitFailure;
}

}  // namespace

int run_launch(int argc, char** argv) {
  LaunchOptions o;
  try {
    o = parse_launch(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "dflash-host launch: " << e.what() << "\n";
    return kExitUsage;
  }
  int port = o.master_port;
  try {
    if (port == 0) port = free_port();
  } catch (const std::exception& e) {
    std::cerr << "dflash-host launch: " << e.what() << "\n";
    return kExitFailure;
  }
  std::string secret;
  try {
    // Never logged. The user's own (for ranks started elsewhere by hand), else one made for this run.
    const auto given = dist::rendezvous::RunSecret::from_environment();
    secret = given ? given->text() : dist::rendezvous::RunSecret::generate().text();
  } catch (const std::exception& e) {
    std::cerr << "dflash-host launch: " << e.what() << "\n";
    return kExitUsage;
  }
  const std::string program = boost::dll::program_location().string();
  // As torchrun: ranks sharing the CPUs run one intra-op thread each unless
  // told otherwise (N ranks × all cores each would oversubscribe them).
  if (o.nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    ::setenv("OMP_NUM_THREADS", "1", 1);
    log::info("launch: OMP_NUM_THREADS=1 for each of the " + std::to_string(o.nproc) + " ranks (set it to choose)");
  }
  std::vector<std::string> args{program};
  args.insert(args.end(), o.arguments.begin(), o.arguments.end());

  struct sigaction forward {};
  forward.sa_handler = remember_signal;
  sigemptyset(&forward.sa_mask);
  ::sigaction(SIGINT, &forward, nullptr);
  ::sigaction(SIGTERM, &forward, nullptr);

  std::map<pid_t, int> ranks;  // pid → rank
  for (int rank = 0; rank < o.nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::cerr << "dflash-host launch: fork() failed: " << std::strerror(errno) << "\n";
      for (const auto& [child, r] : ranks) ::kill(child, SIGTERM);
      return kExitFailure;
    }
    if (pid == 0) {
      const std::pair<const char*, std::string> env[] = {
          {"RANK", std::to_string(rank)},          {"WORLD_SIZE", std::to_string(o.nproc)},
          {"LOCAL_RANK", std::to_string(rank)},    {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
          {"GROUP_RANK", "0"},                     {"MASTER_ADDR", o.master_addr},
          {"MASTER_PORT", std::to_string(port)},  {dist::rendezvous::kSecretVariable, secret}};
      for (const auto& [name, value] : env) ::setenv(name, value.c_str(), 1);
      std::vector<char*> argv_child;
      for (std::string& a : args) argv_child.push_back(a.data());
      argv_child.push_back(nullptr);
      ::execv(program.c_str(), argv_child.data());
      std::cerr << "dflash-host launch: cannot run " << program << ": " << std::strerror(errno) << "\n";
      ::_exit(127);
    }
    ranks[pid] = rank;
    log::info("launch: rank " + std::to_string(rank) + " is pid " + std::to_string(pid));
  }
  log::info("launch: " + std::to_string(o.nproc) + " ranks, rendezvous at " + o.master_addr + ":" + std::to_string(port));

  std::optional<int> first_failure, first_specific;
  std::optional<std::chrono::steady_clock::time_point> stop_by;
  bool terminated = false, killed = false;
  int forwarded = 0;
  while (!ranks.empty()) {
    if (g_forward != 0 && g_forward != forwarded) {
      forwarded = g_forward;
      for (const auto& [child, r] : ranks) ::kill(child, forwarded);
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      const auto it = ranks.find(done);
      if (it == ranks.end()) continue;
      const int rank = it->second;
      ranks.erase(it);
      if (exit_code(status) != 0) {
        log::warn("launch: rank " + std::to_string(rank) + " ended: " + exit_text(status));
        if (!first_specific && !terminated && exit_code(status) != kExitFailure) first_specific = exit_code(status);
        if (!first_failure) {
          first_failure = exit_code(status);
          stop_by = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.stop_grace_s * 1000));
        }
      }
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (stop_by && now > *stop_by && !terminated) {
      log::warn("launch: the other ranks did not stop within --stop-grace-s; sending them SIGTERM");
      // SIGCONT too: a stopped rank acts on SIGTERM only once it runs again.
      for (const auto& [child, r] : ranks) {
        ::kill(child, SIGTERM);
        ::kill(child, SIGCONT);
      }
      terminated = true;
      stop_by = now + std::chrono::seconds(10);
    } else if (stop_by && now > *stop_by && terminated && !killed) {
      for (const auto& [child, r] : ranks) ::kill(child, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return first_specific ? *first_specific : first_failure.value_or(kExitOk);
}

}  // namespace dflash::cli
