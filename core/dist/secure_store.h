// The run's rendezvous store (rendezvous/store_client.h) as a c10d::Store,
// for what expects one: c10d's process groups (Gloo, NCCL), PrefixStore, the
// watch. Internal to core/dist (it includes c10d's headers).
#pragma once

#include "dist/rendezvous/store_client.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

namespace dflash::dist::detail {

class SecureStore final : public c10d::Store {
 public:
  SecureStore(const rendezvous::Endpoint& server, const rendezvous::RunSecret& secret, std::chrono::milliseconds timeout);

  // A new connection to the same store (c10d since 2.x asks for one per
  // thread that uses a store; older c10d has no such method, so no
  // `override`).
  virtual c10::intrusive_ptr<c10d::Store> clone();

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::unique_ptr<rendezvous::StoreClient> client_;
};

}  // namespace dflash::dist::detail
