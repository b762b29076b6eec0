// The rendezvous store's wire: frames (a 4-byte little-endian length, then
// the payload), the fields inside them, the handshake's constants, and the
// socket calls both ends share (addresses, and reading and writing against a
// deadline).
//
// The handshake, before which the server reads nothing but its fixed-size
// answer:
//   server → client  "DFSTORE1" + server nonce (32 bytes)
//   client → server  "DFSTORE1" + client nonce (32) + prove("client", server nonce + client nonce)
//   server → client  'O' + prove("server", client nonce + server nonce)   (accepted)
//                or  'R' + a reason                                        (refused; the server closes)
// Then requests, one at a time per connection: an op byte and its fields;
// each gets one reply.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::dist::rendezvous {

using Clock = std::chrono::steady_clock;

inline constexpr char kMagic[] = "DFSTORE1";  // 8 bytes on the wire
inline constexpr size_t kMagicBytes = 8;
inline constexpr size_t kNonceBytes = 32;
// The client's answer is all the server reads before it trusts a client: a
// frame announcing more is not a rank of the run, and is dropped at once.
inline constexpr uint32_t kLargestHandshakeFrame = 128;
// Keys and values are small control messages (addresses, ids, counters).
inline constexpr uint32_t kLargestFrame = 64u << 20;
inline constexpr const char* kClientProof = "dflash rendezvous client";
inline constexpr const char* kServerProof = "dflash rendezvous server";

enum class Op : uint8_t {
  set = 'S',
  get = 'G',          // waits until the key is set
  add = 'A',
  check = 'C',
  erase = 'D',
  num_keys = 'N',
  wait = 'W',         // waits until every key is set
  compare_set = 'X',
};
enum class Reply : uint8_t { ok = 'K', value = 'V', integer = 'I', boolean = 'B', error = 'E' };

// A peer that broke the protocol or went away.
class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A deadline passed first.
class WireTimeout : public WireError {
 public:
  using WireError::WireError;
};

class FrameWriter {
 public:
  FrameWriter& byte(uint8_t value);
  FrameWriter& integer(int64_t value);
  FrameWriter& text(const std::string& value);
  FrameWriter& texts(const std::vector<std::string>& values);
  FrameWriter& raw(const std::string& bytes);
  std::string frame() const;  // length + payload

 private:
  std::string payload_;
};

// Reads the fields of one payload; WireError when it ends early.
class FrameReader {
 public:
  explicit FrameReader(const std::string& payload) : payload_(payload) {}
  uint8_t byte();
  int64_t integer();
  std::string text();
  std::vector<std::string> texts();
  std::string raw(size_t count);
  bool done() const { return at_ == payload_.size(); }

 private:
  const std::string& payload_;
  size_t at_ = 0;
};

uint32_t frame_length(const char* four_bytes);

// A socket address and how messages write it ("127.0.0.1:29500", "[::1]:29500").
struct Endpoint {
  sockaddr_storage address{};
  socklen_t length = 0;
  std::string text() const;
  std::string host() const;  // numeric, without the port
  int port() const;
  bool is_loopback() const;
};

// `host`'s first IPv4 address (else IPv6) with `port`: the same choice on
// the server and on its clients. Throws std::invalid_argument naming `host`.
Endpoint resolve(const std::string& host, int port);
// This host's address on the route toward `peer` (what a rank elsewhere
// reaches it at); `peer` itself when it is local.
Endpoint local_address_toward(const Endpoint& peer);

// The fd, closed on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }
  int fd() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

// Blocking ends for the client, each bounded by `deadline`.
Socket connect_before(const Endpoint& to, Clock::time_point deadline);  // WireTimeout; WireError on refusal
void send_before(int fd, const std::string& bytes, Clock::time_point deadline);
std::string receive_frame_before(int fd, Clock::time_point deadline, uint32_t largest);

}  // namespace dflash::dist::rendezvous
