#include "dist/secure_store.h"

namespace dflash::dist::detail {
namespace {

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

// c10d's "no timeout" is zero; the store's requests always have one.
std::chrono::milliseconds bounded(std::chrono::milliseconds timeout) {
  return timeout.count() > 0 ? timeout : std::chrono::milliseconds(std::chrono::hours(24 * 7));
}

}  // namespace

SecureStore::SecureStore(const rendezvous::Endpoint& server, const rendezvous::RunSecret& secret, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), client_(std::make_unique<rendezvous::StoreClient>(server, secret, bounded(timeout))) {}

c10::intrusive_ptr<c10d::Store> SecureStore::clone() {
  return c10::make_intrusive<SecureStore>(client_->server(), client_->secret(), timeout_);
}

void SecureStore::set(const std::string& key, const std::vector<uint8_t>& value) { client_->set(key, text_of(value), bounded(timeout_)); }

std::vector<uint8_t> SecureStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  return bytes_of(client_->compare_set(key, text_of(expected), text_of(desired), bounded(timeout_)));
}

std::vector<uint8_t> SecureStore::get(const std::string& key) { return bytes_of(client_->get(key, bounded(timeout_))); }

int64_t SecureStore::add(const std::string& key, int64_t value) { return client_->add(key, value, bounded(timeout_)); }

bool SecureStore::deleteKey(const std::string& key) { return client_->erase(key, bounded(timeout_)); }

bool SecureStore::check(const std::vector<std::string>& keys) { return client_->check(keys, bounded(timeout_)); }

int64_t SecureStore::getNumKeys() { return client_->num_keys(bounded(timeout_)); }

void SecureStore::wait(const std::vector<std::string>& keys) { client_->wait(keys, bounded(timeout_)); }

void SecureStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  client_->wait(keys, bounded(timeout));
}

}  // namespace dflash::dist::detail
