// A loopback port nothing listens on now (the kernel's choice), for a test's
// rendezvous. (Another process may take it before the test does; the
// kernel hands out ports in turn, so that is rare.)
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace dflash::test {

inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace dflash::test
