// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the rendezvous
// store's proof that a client and the server hold the same run secret.
// Written here rather than taken from OpenSSL because neither build machine
// may be assumed to have its headers (the GPU machine has no package
// manager); tests/core/dist/rendezvous_test.cpp checks both against the
// published test vectors (FIPS 180-4 examples, RFC 4231).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace dflash::dist::rendezvous {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(const std::string& bytes) { update(bytes.data(), bytes.size()); }
  Digest finish();  // once; the object is spent after it

 private:
  void compress(const uint8_t* block);
  uint32_t state_[8];
  uint8_t block_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest sha256(const std::string& bytes);
Digest hmac_sha256(const std::string& key, const std::string& message);

// Whether two digests are equal, in time that does not depend on where they
// first differ (a byte-by-byte compare that stops early leaks the prefix).
bool equal_in_constant_time(const Digest& a, const Digest& b);

std::string to_hex(const Digest& digest);
// 64 hex digits (either case) as a digest; nullopt for anything else.
std::optional<Digest> digest_from_hex(const std::string& hex);

}  // namespace dflash::dist::rendezvous
