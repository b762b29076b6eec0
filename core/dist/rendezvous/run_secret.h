// The secret the ranks of one run share, and with which they prove to the
// rendezvous store (and it to them) that they belong to the run.
// `dflash-host launch` makes one per run and hands it to its ranks in
// $DFLASH_RUN_SECRET; under torchrun the user exports the same value on
// every node (or names a file only they can read in $DFLASH_RUN_SECRET_FILE).
// The secret itself never crosses the network and is never logged: a client
// and the store each send an HMAC-SHA256 of the other's fresh nonce.
#pragma once

#include "dist/rendezvous/sha256.h"

#include <optional>
#include <string>

namespace dflash::dist::rendezvous {

inline constexpr const char* kSecretVariable = "DFLASH_RUN_SECRET";
inline constexpr const char* kSecretFileVariable = "DFLASH_RUN_SECRET_FILE";
inline constexpr size_t kLeastSecretCharacters = 32;

class RunSecret {
 public:
  // 32 bytes from the kernel's random source, as 64 hex digits.
  static RunSecret generate();
  // `text` as the secret; throws std::invalid_argument (naming `source`)
  // when it is shorter than kLeastSecretCharacters.
  static RunSecret from_text(std::string text, const std::string& source);
  // $DFLASH_RUN_SECRET, else the first line of $DFLASH_RUN_SECRET_FILE
  // (refused when others may read it); nullopt when neither is set.
  static std::optional<RunSecret> from_environment();

  // What `text` is for this run: an HMAC under the secret, bound to `purpose`
  // (so that a proof made for one step of the handshake is no good for another).
  Digest prove(const std::string& purpose, const std::string& text) const;
  bool verify(const std::string& purpose, const std::string& text, const Digest& proof) const;

  // For the launcher, which passes it to its ranks in their environment.
  const std::string& text() const { return text_; }

 private:
  explicit RunSecret(std::string text) : text_(std::move(text)) {}
  std::string text_;
};

// 32 bytes from the kernel's random source (getrandom), for secrets and nonces.
std::string random_bytes(size_t count);

}  // namespace dflash::dist::rendezvous
