#include "dist/rendezvous/wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dflash::dist::rendezvous {

FrameWriter& FrameWriter::byte(uint8_t value) {
  payload_ += static_cast<char>(value);
  return *this;
}

FrameWriter& FrameWriter::integer(int64_t value) {
  for (int i = 0; i < 8; ++i) payload_ += static_cast<char>(static_cast<uint64_t>(value) >> (8 * i));
  return *this;
}

FrameWriter& FrameWriter::text(const std::string& value) {
  const auto n = static_cast<uint32_t>(value.size());
  for (int i = 0; i < 4; ++i) payload_ += static_cast<char>(n >> (8 * i));
  payload_ += value;
  return *this;
}

FrameWriter& FrameWriter::texts(const std::vector<std::string>& values) {
  integer(static_cast<int64_t>(values.size()));
  for (const auto& v : values) text(v);
  return *this;
}

FrameWriter& FrameWriter::raw(const std::string& bytes) {
  payload_ += bytes;
  return *this;
}

std::string FrameWriter::frame() const {
  const auto n = static_cast<uint32_t>(payload_.size());
  std::string out;
  for (int i = 0; i < 4; ++i) out += static_cast<char>(n >> (8 * i));
  return out + payload_;
}

uint32_t frame_length(const char* four_bytes) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t(static_cast<uint8_t>(four_bytes[i])) << (8 * i);
  return n;
}

std::string FrameReader::raw(size_t count) {
  if (payload_.size() - at_ < count) throw WireError("a message ended early");
  std::string out = payload_.substr(at_, count);
  at_ += count;
  return out;
}

uint8_t FrameReader::byte() { return static_cast<uint8_t>(raw(1)[0]); }

int64_t FrameReader::integer() {
  const std::string b = raw(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<uint8_t>(b[static_cast<size_t>(i)])) << (8 * i);
  return static_cast<int64_t>(v);
}

std::string FrameReader::text() { return raw(frame_length(raw(4).data())); }

std::vector<std::string> FrameReader::texts() {
  const int64_t n = integer();
  // Each text takes at least its 4-byte length: a count beyond that is a lie.
  if (n < 0 || static_cast<uint64_t>(n) > (payload_.size() - at_) / 4) throw WireError("a message announced more keys than it holds");
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(text());
  return out;
}

std::string Endpoint::host() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(address).sin_addr, host, sizeof host);
  else ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(address).sin6_addr, host, sizeof host);
  return host;
}

std::string Endpoint::text() const {
  return (address.ss_family == AF_INET ? host() : "[" + host() + "]") + ":" + std::to_string(port());
}

int Endpoint::port() const {
  return address.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port)
                                      : ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
}

bool Endpoint::is_loopback() const {
  if (address.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(address).sin_addr.s_addr) >> 24) == 127;
  return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(address).sin6_addr);
}

Endpoint resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (status != 0) throw std::invalid_argument("cannot resolve '" + host + "': " + ::gai_strerror(status));
  const addrinfo* chosen = nullptr;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next)
    if (a->ai_family == AF_INET && chosen == nullptr) chosen = a;
  for (const addrinfo* a = found; a != nullptr && chosen == nullptr; a = a->ai_next)
    if (a->ai_family == AF_INET6) chosen = a;
  if (chosen == nullptr) {
    ::freeaddrinfo(found);
    throw std::invalid_argument("'" + host + "' has no IPv4 or IPv6 address");
  }
  Endpoint out;
  std::memcpy(&out.address, chosen->ai_addr, chosen->ai_addrlen);
  out.length = chosen->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

Endpoint local_address_toward(const Endpoint& peer) {
  // A UDP socket's connect() sends nothing; it only picks the route, and
  // with it the local address.
  Socket probe(::socket(peer.address.ss_family, SOCK_DGRAM, 0));
  Endpoint out;
  out.length = sizeof out.address;
  if (!probe || ::connect(probe.fd(), reinterpret_cast<const sockaddr*>(&peer.address), peer.length) != 0 ||
      ::getsockname(probe.fd(), reinterpret_cast<sockaddr*>(&out.address), &out.length) != 0)
    throw std::invalid_argument("no route from this host to " + peer.text() + ": " + std::strerror(errno));
  if (out.address.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(out.address).sin_port = 0;
  else reinterpret_cast<sockaddr_in6&>(out.address).sin6_port = 0;
  return out;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

// Waits for `events` on `fd` until `deadline`; WireTimeout after it.
void await(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throw WireTimeout("no answer in time");
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (ready > 0) return;
    if (ready < 0 && errno != EINTR) throw WireError(std::string("poll(): ") + std::strerror(errno));
  }
}

void receive_exactly(int fd, char* into, size_t count, Clock::time_point deadline) {
  size_t have = 0;
  while (have < count) {
    const ssize_t got = ::recv(fd, into + have, count - have, 0);
    if (got > 0) {
      have += static_cast<size_t>(got);
    } else if (got == 0) {
      throw WireError("the connection was closed");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      await(fd, POLLIN, deadline);
    } else if (errno != EINTR) {
      throw WireError(std::string("recv(): ") + std::strerror(errno));
    }
  }
}

}  // namespace

Socket connect_before(const Endpoint& to, Clock::time_point deadline) {
  Socket s(::socket(to.address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s) throw WireError(std::string("socket(): ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&to.address), to.length) != 0) {
    if (errno != EINPROGRESS) throw WireError(std::strerror(errno));
    await(s.fd(), POLLOUT, deadline);
    int error = 0;
    socklen_t n = sizeof error;
    ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &n);
    if (error != 0) throw WireError(std::strerror(error));
  }
  return s;
}

void send_before(int fd, const std::string& bytes, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      await(fd, POLLOUT, deadline);
    } else if (errno != EINTR) {
      throw WireError(std::string("send(): ") + std::strerror(errno));
    }
  }
}

std::string receive_frame_before(int fd, Clock::time_point deadline, uint32_t largest) {
  char length[4];
  receive_exactly(fd, length, 4, deadline);
  const uint32_t n = frame_length(length);
  if (n > largest) throw WireError("a message of " + std::to_string(n) + " bytes, more than the " + std::to_string(largest) + " allowed");
  std::string payload(n, '\0');
  receive_exactly(fd, payload.data(), n, deadline);
  return payload;
}

}  // namespace dflash::dist::rendezvous
