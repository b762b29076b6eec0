#include "dist/process_group.h"

#include "dist/c10d_collective.h"
#include "dist/rendezvous/store_server.h"
#include "dist/secure_store.h"
#include "log/log.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#if DFLASH_HOST_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/core/Device.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace dflash::dist {
namespace {

using detail::SecureStore;
using std::chrono::milliseconds;

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int whole(const char* name, const std::string& text, int least, int most) {
  const std::optional<int> value = parse_bounded_int(text, least, most);
  if (!value)
    throw std::invalid_argument("$" + std::string(name) + " is '" + text + "'; expected a whole number from " +
                                std::to_string(least) + " to " + std::to_string(most) +
                                " (set by torchrun or `dflash-host launch`)");
  return *value;
}

std::string key(const std::string& what, int rank) { return "dflash/" + what + "/" + std::to_string(rank); }

std::string as_text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

// What every group of a run shares: the rendezvous and the device.
struct GroupContext {
  std::shared_ptr<rendezvous::StoreServer> server;  // rank 0's; the others' is null
  rendezvous::Endpoint store_at;
  c10::intrusive_ptr<c10d::Store> store;
  LaunchEnvironment env;
  std::string address, device;
  milliseconds timeout;
};

// A new client of the run's store (each group's watch and key-value users have their own).
// `timeout`: how long one request may wait (the run's collective_timeout_s unless shorter).
c10::intrusive_ptr<c10d::Store> connect(const GroupContext& ctx, milliseconds timeout) {
  return c10::make_intrusive<SecureStore>(ctx.store_at, *ctx.env.secret, timeout);
}
c10::intrusive_ptr<c10d::Store> connect(const GroupContext& ctx) { return connect(ctx, ctx.timeout); }

// A read of the others' heartbeats when a collective failed waits at most
// this long: a store that does not answer by then is stalled (rank 0
// stopped), and the diagnosis says so instead of waiting out
// collective_timeout_s a second time. A heartbeat (one a second) that
// cannot be written in 2 s is skipped; nor does it hold up the rank's exit.
constexpr milliseconds kWatchReadTimeout{10000};
constexpr milliseconds kHeartbeatTimeout{2000};

// Under torchrun's agent store: rank 0 serves the run's store on a port of
// its own, on the address facing MASTER_ADDR, and publishes where in the
// agent's store, signed; the others read it there and check the signature,
// so a key written by anyone else into the agent's (open) store is refused.
constexpr const char* kPublishedKey = "dflash/rendezvous_store";
constexpr const char* kAddressProof = "dflash rendezvous address";

rendezvous::Endpoint meet_through_agent(GroupContext& ctx, const rendezvous::Endpoint& agent_at) {
  const LaunchEnvironment& env = ctx.env;
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = ctx.timeout;
  const auto agent = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(env.restart_count),
                                                            c10::make_intrusive<c10d::TCPStore>(env.master_addr, options));
  if (env.rank == 0) {
    ctx.server = std::make_shared<rendezvous::StoreServer>(rendezvous::local_address_toward(agent_at), *env.secret);
    const std::string where = ctx.server->address().host() + " " + std::to_string(ctx.server->address().port());
    const rendezvous::Digest proof = env.secret->prove(kAddressProof, where);
    const std::string value = where + " " + rendezvous::to_hex(proof);
    agent->set(kPublishedKey, std::vector<uint8_t>(value.begin(), value.end()));
    return ctx.server->address();
  }
  const std::string value = as_text(agent->get(kPublishedKey));
  std::istringstream in(value);
  std::string host, port, proof_hex;
  in >> host >> port >> proof_hex;
  const std::string where = host + " " + port;
  const std::optional<int> port_number = parse_bounded_int(port, 1, 65535);
  const std::optional<rendezvous::Digest> proof = rendezvous::digest_from_hex(proof_hex);
  if (!port_number || !proof || !env.secret->verify(kAddressProof, where, *proof))
    throw CollectiveError("rank " + std::to_string(env.rank) + ": the address of the run's store published in torchrun's store at " +
                          agent_at.text() + " is not signed with this rank's run secret: the ranks do not share one $" +
                          rendezvous::kSecretVariable + ", or another program wrote it. Export the same secret on every node");
  return rendezvous::resolve(host, *port_number);
}

// Every rank checks in; the ranks that have not within the timeout are named.
void await_ranks(c10d::Store& store, const LaunchEnvironment& env, milliseconds timeout, const std::string& address) {
  store.set(key("joined", env.rank), std::vector<uint8_t>{'1'});
  store.add("dflash/joined", 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (store.add("dflash/joined", 0) < env.world_size) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int r = 0; r < env.world_size; ++r)
        if (!store.check({key("joined", r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw CollectiveError("rank " + std::to_string(env.rank) + ": rank" + (missing.find(',') == std::string::npos ? " " : "s ") +
                            missing + " did not join the run at " + address + " within train.collective_timeout_s (" +
                            std::to_string(timeout.count() / 1000) + " s); start all " + std::to_string(env.world_size) +
                            " ranks with the same MASTER_ADDR and MASTER_PORT");
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
}

#if DFLASH_HOST_GLOO
std::shared_ptr<::gloo::transport::Device> gloo_device(const LaunchEnvironment& env, const rendezvous::Endpoint& store_at) {
  // As torch.distributed: the interface GLOO_SOCKET_IFNAME names, else the
  // address this host's name resolves to; a single host falls back to loopback.
  // Ranks that meet at a loopback address are all on this host: Gloo's
  // connections stay on loopback too, reachable from no other machine.
  if (const auto ifname = variable("GLOO_SOCKET_IFNAME")) return c10d::ProcessGroupGloo::createDeviceForInterface(*ifname);
  if (store_at.is_loopback()) return c10d::ProcessGroupGloo::createDeviceForHostname(store_at.host());
  try {
    return c10d::ProcessGroupGloo::createDefaultDevice();
  } catch (const std::exception& e) {
    if (env.local_world_size != env.world_size) throw;
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
}
#endif

}  // namespace

std::optional<int> parse_bounded_int(const std::string& text, int least, int most) {
  size_t used = 0;
  long value = -1;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || value < least || value > most) return std::nullopt;
  return static_cast<int>(value);
}

std::optional<LaunchEnvironment> launch_environment() {
  const char* const names[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> set, unset;
  for (const char* name : names) (variable(name) ? set : unset).push_back(name);
  if (set.empty()) return std::nullopt;
  if (!unset.empty()) {
    std::string have, lack;
    for (const auto& n : set) have += (have.empty() ? "$" : ", $") + n;
    for (const auto& n : unset) lack += (lack.empty() ? "$" : ", $") + n;
    throw std::invalid_argument(have + " set but " + lack +
                                " not: a rank of a multi-process run needs all of RANK, WORLD_SIZE, MASTER_ADDR and "
                                "MASTER_PORT (torchrun and `dflash-host launch` set them); unset them to run one process");
  }
  LaunchEnvironment env;
  env.world_size = whole("WORLD_SIZE", *variable("WORLD_SIZE"), 1, 1 << 20);
  env.rank = whole("RANK", *variable("RANK"), 0, env.world_size - 1);
  env.master_addr = *variable("MASTER_ADDR");
  env.master_port = whole("MASTER_PORT", *variable("MASTER_PORT"), 1, 65535);
  env.local_world_size = variable("LOCAL_WORLD_SIZE") ? whole("LOCAL_WORLD_SIZE", *variable("LOCAL_WORLD_SIZE"), 1, env.world_size)
                                                      : env.world_size;
  env.local_rank = variable("LOCAL_RANK") ? whole("LOCAL_RANK", *variable("LOCAL_RANK"), 0, env.local_world_size - 1)
                                          : env.rank % env.local_world_size;
  env.agent_store = variable("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  env.restart_count = variable("TORCHELASTIC_RESTART_COUNT")
                          ? whole("TORCHELASTIC_RESTART_COUNT", *variable("TORCHELASTIC_RESTART_COUNT"), 0, 1 << 20)
                          : 0;
  env.secret = rendezvous::RunSecret::from_environment();
  if (!env.secret)
    throw std::invalid_argument(std::string("$") + rendezvous::kSecretVariable + " is not set: the ranks of a run prove to its "
                                "rendezvous store that they belong to it with a secret they share. `dflash-host launch` gives its "
                                "ranks one; under torchrun export the same one on every node (e.g. " + rendezvous::kSecretVariable +
                                "=$(openssl rand -hex 32)), or name a file only you can read in $" + rendezvous::kSecretFileVariable);
  return env;
}

std::string rank_device(const std::string& device, const LaunchEnvironment& env) {
  const c10::Device d(device);
  if (!d.is_cuda()) return device;
  if (!d.has_index()) return "cuda:" + std::to_string(env.local_rank);
  if (env.local_world_size > 1)
    throw std::invalid_argument("train.device is " + device + " but " + std::to_string(env.local_world_size) +
                                " ranks run on this node: they would share one GPU. Write \"cuda\": rank r then uses "
                                "cuda:LOCAL_RANK");
  return device;
}

namespace {

class StoreKeyValue final : public KeyValue {
 public:
  explicit StoreKeyValue(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::optional<std::string> get_if_set(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    return as_text(store_->get(key));
  }
  void erase(const std::string& key) override { store_->deleteKey(key); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// The group of the world ranks `members` (ascending; this rank among them),
// named `name` ("" for the world): its own store prefix, its own watch, and
// the way its members make subgroups of it.
std::unique_ptr<Collective> make_group(const std::shared_ptr<const GroupContext>& ctx, const std::vector<int>& members,
                                       const std::string& name) {
  const LaunchEnvironment& env = ctx->env;
  const auto at = std::find(members.begin(), members.end(), env.rank);
  if (at == members.end())
    throw std::logic_error("group '" + name + "' made on rank " + std::to_string(env.rank) + ", not one of its members");
  const int rank = static_cast<int>(at - members.begin()), size = static_cast<int>(members.size());
  const std::string scope = name.empty() ? "" : name + "/";
  // The watch's own clients, one for its heartbeats and one for reading
  // them: neither waits behind a collective's store traffic or the other.
  auto watch = std::make_unique<detail::Watch>(connect(*ctx, std::min(ctx->timeout, kHeartbeatTimeout)),
                                               connect(*ctx, std::min(ctx->timeout, kWatchReadTimeout)), rank, size,
                                               ctx->address, scope, members);
  const auto group_store = c10::make_intrusive<c10d::PrefixStore>(name.empty() ? "dflash_group" : "dflash_group/" + name, ctx->store);
  GroupMakers makers;
  makers.subgroup = [ctx, members](const std::vector<int>& sub, const std::string& sub_name) {
    std::vector<int> world;
    for (int r : sub) world.push_back(members.at(static_cast<size_t>(r)));
    return make_group(ctx, world, sub_name);
  };
  makers.key_value = [ctx]() -> std::unique_ptr<KeyValue> {
    return std::make_unique<StoreKeyValue>(connect(*ctx));
  };
  const c10::Device where(ctx->device);
  if (where.is_cuda()) {
    if (!detail::nccl_available())
      throw std::invalid_argument("train.device is " + ctx->device + " but this build of dflash-host has no NCCL (a CPU "
                                  "LibTorch): several ranks on CUDA need a CUDA build");
    return detail::join_nccl(group_store, rank, size, where, ctx->timeout, std::move(watch), std::move(makers));
  }
#if DFLASH_HOST_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create(ctx->timeout);
  options->devices.push_back(gloo_device(env, ctx->store_at));
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  try {
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(group_store, rank, size, options);
  } catch (const std::exception& e) {
    throw CollectiveError(watch->diagnose("the Gloo process group's connections", e.what()));
  }
  log::info("rank " + std::to_string(env.rank) + (name.empty() ? " of " + std::to_string(size) + " joined at " + ctx->address
                                                                : " joined group '" + name + "' as its rank " + std::to_string(rank) +
                                                                      " of " + std::to_string(size)) +
            " (Gloo, " + ctx->device + ")");
  return std::make_unique<detail::C10dCollective<c10d::ProcessGroupGloo>>(
      group, rank, size, std::nullopt, std::move(watch), std::function<void(c10d::ProcessGroupGloo&)>{}, std::move(makers));
#else
  throw std::invalid_argument("train.device is " + ctx->device + " but this build of dflash-host has no Gloo (its LibTorch "
                              "came without Gloo's headers): several ranks on the CPU are not available");
#endif
}

}  // namespace

std::unique_ptr<Collective> join(const LaunchEnvironment& env, const std::string& device, double timeout_s) {
  if (!env.secret) throw std::logic_error("dist::join without the run secret (launch_environment() reads it)");
  // A write to a peer that has gone (Gloo's connections, the store's) must
  // fail with EPIPE and be reported, not kill this rank with SIGPIPE. (c10d's
  // TCPStore, which the rendezvous used before, ignored it the same way.)
  ::signal(SIGPIPE, SIG_IGN);
  auto ctx = std::make_shared<GroupContext>();
  ctx->env = env;
  ctx->device = device;
  ctx->timeout = milliseconds(static_cast<int64_t>(timeout_s * 1000));
  ctx->address = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    const rendezvous::Endpoint master = rendezvous::resolve(env.master_addr, env.master_port);
    if (env.agent_store) {
      ctx->store_at = meet_through_agent(*ctx, master);
    } else {
      // Rank 0 serves on MASTER_ADDR's address alone: the one the ranks use.
      if (env.rank == 0) ctx->server = std::make_shared<rendezvous::StoreServer>(master, *env.secret);
      ctx->store_at = master;
    }
    ctx->address = ctx->store_at.text();
    if (ctx->server)
      log::info("serving the run's rendezvous store at " + ctx->address + " to the ranks that prove the run secret" +
                (env.agent_store ? " (its address signed in torchrun's store)" : ""));
    ctx->store = connect(*ctx);
    await_ranks(*ctx->store, env, ctx->timeout, ctx->address);
  } catch (const CollectiveError&) {
    throw;
  } catch (const rendezvous::StoreError& e) {
    throw CollectiveError("rank " + std::to_string(env.rank) + ": " + e.what());
  } catch (const std::exception& e) {
    std::string text = e.what();
    text = text.substr(0, text.find('\n'));
    throw CollectiveError("rank " + std::to_string(env.rank) + ": the rendezvous at " + ctx->address + " failed: " + text +
                          (env.rank == 0 ? "" : " (is rank 0 running, and MASTER_ADDR reachable from here?)"));
  }
  std::vector<int> everyone(static_cast<size_t>(env.world_size));
  for (int r = 0; r < env.world_size; ++r) everyone[static_cast<size_t>(r)] = r;
  return make_group(ctx, everyone, "");
}

namespace detail {

Watch::Watch(c10::intrusive_ptr<c10d::Store> beats, c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
             std::string store_address, std::string scope,
             std::vector<int> world_ranks)
    : beats_(std::move(beats)), store_(std::move(store)), rank_(rank), world_size_(world_size), store_address_(std::move(store_address)),
      scope_(std::move(scope)), world_ranks_(std::move(world_ranks)) {
  thread_ = std::thread([this] { beat_loop(); });
}

Watch::~Watch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// A failure is announced once, under the world rank: every group's watch reads it.
std::string Watch::failed_key(int rank) const {
  return failure_key(world_ranks_.empty() ? rank : world_ranks_.at(static_cast<size_t>(rank)));
}

std::string Watch::name(int rank) const {
  return "rank " + std::to_string(world_ranks_.empty() ? rank : world_ranks_.at(static_cast<size_t>(rank)));
}

void Watch::beat_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (int64_t beat = 0; !stop_; ++beat) {
    const std::string value = std::to_string(beat) + " " + std::to_string(collectives_.load());
    lock.unlock();
    try {
      beats_->set(heartbeat_key(rank_, scope_), std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const std::exception&) {
      // The store is gone (its host exited): the collective that fails says so.
    }
    lock.lock();
    stop_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
  }
}

void Watch::announce_failure(const std::string& reason) {
  try {
    const std::string text = reason.substr(0, 400);
    store_->set(failed_key(rank_), std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
  }
}

std::string Watch::diagnose(const std::string& what, const std::string& error, std::optional<int> peer) {
  const std::string me = name(rank_);
  const std::string first = error.substr(0, error.find('\n'));
  std::string head = me + ": " + what + " failed (" + first + ")";
  const std::string advice =
      ". The last checkpoint is intact; relaunch to resume from it (torchrun --max-restarts does so by itself)";
  try {
    // Two readings of every heartbeat, 2.5 beats apart.
    std::map<int, std::string> before, after, failed;
    auto examined = [&](int r) { return r != rank_ && (!peer || r == *peer); };
    auto read = [&](std::map<int, std::string>& into) {
      for (int r = 0; r < world_size_; ++r) {
        if (!examined(r)) continue;
        if (store_->check({heartbeat_key(r, scope_)})) into[r] = as_text(store_->get(heartbeat_key(r, scope_)));
      }
    };
    read(before);
    std::this_thread::sleep_for(milliseconds(2500));
    read(after);
    for (int r = 0; r < world_size_; ++r)
      if (examined(r) && store_->check({failed_key(r)})) failed[r] = as_text(store_->get(failed_key(r)));
    std::vector<std::string> findings;
    for (int r = 0; r < world_size_; ++r) {
      if (!examined(r)) continue;
      const std::string who = name(r);
      if (failed.count(r)) {
        findings.push_back(who + " failed: " + failed[r]);
      } else if (!after.count(r)) {
        findings.push_back(who + " never started its heartbeat");
      } else if (before[r] == after[r]) {
        findings.push_back(who + " stopped responding (it exited, was killed or is stopped)");
      } else if (peer) {
        findings.push_back(who + " is alive but did not take part in time (train.collective_timeout_s)");
      } else {
        std::istringstream in(after[r]);
        int64_t beat = 0, begun = 0;
        in >> beat >> begun;
        if (begun < collectives_.load())
          findings.push_back(who + " is alive but did not reach this collective (it has begun " + std::to_string(begun) +
                             " collectives, this rank " + std::to_string(collectives_.load()) + ")");
      }
    }
    if (findings.empty())
      return head + (peer ? "; " + name(*peer) + " is alive" : std::string("; every other rank is alive and reached it")) + advice;
    std::string out = head + ": ";
    for (size_t i = 0; i < findings.size(); ++i) out += (i ? "; " : "") + findings[i];
    return out + advice;
  } catch (const std::exception&) {
    return head + ": the rendezvous store at " + store_address_ +
           " is unreachable, so rank 0 (which serves it) has exited or is stopped" + advice;
  }
}

}  // namespace detail
}  // namespace dflash::dist
