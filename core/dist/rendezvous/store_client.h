// A rank's connection to the run's rendezvous store (store_server.h): it
// proves the run secret, checks the store's proof in return, and bounds
// every request by a deadline, so that a stalled store is reported, naming
// its address, instead of hanging the rank. Thread-safe: requests from
// several threads take turns on the one connection.
#pragma once

#include "dist/rendezvous/run_secret.h"
#include "dist/rendezvous/wire.h"

#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::dist::rendezvous {

// What a rank is told when the store cannot be used; the message names the
// store's address, the request, and what to do.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The store turned this rank away: its secret is not the run's.
class StoreRefused : public StoreError {
 public:
  using StoreError::StoreError;
};

class StoreClient {
 public:
  // Connects, retrying a refused connection until `timeout` has passed (the
  // ranks may start before rank 0 serves), and proves the secret.
  StoreClient(Endpoint server, RunSecret secret, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::string& value, std::chrono::milliseconds timeout);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);  // waits until it is set
  int64_t add(const std::string& key, int64_t delta, std::chrono::milliseconds timeout);
  bool check(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  bool erase(const std::string& key, std::chrono::milliseconds timeout);
  int64_t num_keys(std::chrono::milliseconds timeout);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired,
                          std::chrono::milliseconds timeout);

  const Endpoint& server() const { return server_; }
  const RunSecret& secret() const { return secret_; }

 private:
  // The reply to `frame`; `what` names the request in errors ("get 'k'").
  std::string request(const std::string& frame, const std::string& what, std::chrono::milliseconds timeout);
  // `patient`: retry a refused connection until the deadline (the first
  // time: rank 0 may not serve yet); otherwise a refusal means the store,
  // reached before, is gone, and is reported at once.
  void connect(Clock::time_point deadline, bool patient);
  void prove(Clock::time_point deadline);

  const Endpoint server_;
  const RunSecret secret_;
  std::mutex mutex_;
  Socket socket_;  // none after an error: the next request connects again
};

}  // namespace dflash::dist::rendezvous
