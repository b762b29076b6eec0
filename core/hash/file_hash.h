// XXH64 of a file's bytes: the checksum a checkpoint records for each of its
// files, so that a damaged checkpoint is refused at resume instead of being
// trained on. XXH64 runs at memory speed (a 10 GB optimizer state costs about
// a second), where SHA-256 would add tens of seconds to every checkpoint; it
// detects corruption, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dflash::hash {

class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  uint64_t v_[4];
  unsigned char buffer_[32];
  size_t buffered_ = 0;
  uint64_t total_ = 0, seed_;
};

struct FileDigest {
  uint64_t bytes = 0;
  std::string xxh64;  // 16 lowercase hex digits
};

// Reads the whole file; throws naming it when it cannot be read.
FileDigest digest_file(const std::string& path);

std::string to_hex(uint64_t value);

}  // namespace dflash::hash
