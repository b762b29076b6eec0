#include "dist/rendezvous/run_secret.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace dflash::dist::rendezvous {

std::string random_bytes(size_t count) {
  std::string out(count, '\0');
  size_t have = 0;
  while (have < count) {
    const ssize_t got = ::getrandom(out.data() + have, count - have, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom() failed: ") + std::strerror(errno));
    }
    have += static_cast<size_t>(got);
  }
  return out;
}

RunSecret RunSecret::generate() {
  const std::string bytes = random_bytes(32);
  Digest as_digest;
  std::memcpy(as_digest.data(), bytes.data(), as_digest.size());
  return RunSecret(to_hex(as_digest));
}

RunSecret RunSecret::from_text(std::string text, const std::string& source) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  if (text.size() < kLeastSecretCharacters)
    throw std::invalid_argument(source + " holds " + std::to_string(text.size()) + " characters; a run secret needs at least " +
                                std::to_string(kLeastSecretCharacters) + " (for example the output of `openssl rand -hex 32`)");
  return RunSecret(std::move(text));
}

std::optional<RunSecret> RunSecret::from_environment() {
  if (const char* text = std::getenv(kSecretVariable); text != nullptr && *text != '\0')
    return from_text(text, std::string("$") + kSecretVariable);
  const char* path = std::getenv(kSecretFileVariable);
  if (path == nullptr || *path == '\0') return std::nullopt;
  const std::string source = std::string("$") + kSecretFileVariable + " (" + path + ")";
  struct stat info {};
  if (::stat(path, &info) != 0)
    throw std::invalid_argument(source + " cannot be read: " + std::strerror(errno));
  if ((info.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info.st_mode & 07777));
    throw std::invalid_argument(source + " may be read by others (mode " + mode + "): a run secret must be yours alone; chmod 600 it");
  }
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) throw std::invalid_argument(source + " cannot be read or is empty");
  return from_text(line, source);
}

Digest RunSecret::prove(const std::string& purpose, const std::string& text) const {
  // The purpose's length first: "a" + "bc" and "ab" + "c" must not prove the same.
  return hmac_sha256(text_, std::to_string(purpose.size()) + ":" + purpose + text);
}

bool RunSecret::verify(const std::string& purpose, const std::string& text, const Digest& proof) const {
  return equal_in_constant_time(prove(purpose, text), proof);
}

}  // namespace dflash::dist::rendezvous
