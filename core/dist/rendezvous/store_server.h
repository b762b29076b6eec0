// The run's rendezvous store, served by rank 0 from a thread of its own: the
// key-value store the ranks meet at (c10d's process groups exchange their
// addresses through it; the watch's heartbeats, announced failures and the
// pipeline's credits live in it).
//
// Unlike c10d's TCPStore it
//   - listens only on the address it is given (the one the ranks use:
//     loopback for a launch on one machine), never on every interface;
//   - serves a client only after it proves the run secret (run_secret.h),
//     and proves it back; a client that does not is told so and closed,
//     having read and written nothing;
//   - never waits on one client: one poll() loop over non-blocking sockets,
//     so a client that sends half a request and holds its socket delays no
//     one, and is dropped once `request_bound` passes without the rest (as is
//     one that does not finish the handshake, or does not read its replies).
#pragma once

#include "dist/rendezvous/run_secret.h"
#include "dist/rendezvous/wire.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

namespace dflash::dist::rendezvous {

struct ServerLimits {
  // How long a client may take over the handshake, over one request once it
  // has begun sending it, or over reading a reply, before it is dropped.
  std::chrono::milliseconds request_bound{5000};
  // Connections that have not yet proven the secret, at once; more are
  // closed on arrival (a flood of them cannot exhaust the server's files).
  size_t most_unproven = 64;
};

class StoreServer {
 public:
  // Binds `at` (port 0: the kernel picks one) and starts serving. Throws
  // std::runtime_error naming the address and what to do when it cannot.
  StoreServer(const Endpoint& at, RunSecret secret, ServerLimits limits = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Where it listens, the port filled in.
  const Endpoint& address() const { return address_; }

  // What it has turned away, for the tests and the log.
  struct Counts {
    int64_t refused = 0;  // did not prove the secret (or spoke another protocol)
    int64_t dropped = 0;  // stalled past request_bound, or too many unproven at once
  };
  Counts counts() const { return {refused_.load(), dropped_.load()}; }

 private:
  struct State;
  void serve();

  Endpoint address_;
  std::unique_ptr<State> state_;
  std::atomic<int64_t> refused_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace dflash::dist::rendezvous
