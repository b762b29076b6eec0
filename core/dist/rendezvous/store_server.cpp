#include "dist/rendezvous/store_server.h"

#include "log/log.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <optional>
#include <stdexcept>
#include <vector>

namespace dflash::dist::rendezvous {

namespace {

using std::chrono::milliseconds;

struct Connection {
  Socket socket;
  std::string peer;
  bool proven = false;
  std::string nonce;                    // the server's, for the handshake
  Clock::time_point accepted;
  std::string in, out;                  // bytes received and not yet used; bytes not yet sent
  std::optional<Clock::time_point> partial_since, unsent_since;
  std::optional<Op> parked;             // a get or wait waiting for its keys
  std::vector<std::string> parked_keys;
  bool close_after_sending = false, gone = false;
  std::string why_gone;                 // for the log when it was dropped
};

// A reply of `kind`, its fields to follow.
FrameWriter answer(Reply kind) {
  FrameWriter w;
  w.byte(static_cast<uint8_t>(kind));
  return w;
}
std::string reply(Reply kind) { return answer(kind).frame(); }

}  // namespace

struct StoreServer::State {
  Socket listener;
  int wake_read = -1, wake_write = -1;
  std::atomic<bool> stopping{false};
  RunSecret secret;
  ServerLimits limits;
  std::map<std::string, std::string> values;
  std::list<Connection> connections;
  Clock::time_point last_warning{};
  int64_t unwarned = 0;
  explicit State(RunSecret s) : secret(std::move(s)) {}
  ~State() {
    if (wake_read >= 0) ::close(wake_read);
    if (wake_write >= 0) ::close(wake_write);
  }

  // At most one line a second: a flood of foreign clients must not flood the log.
  void warn(const std::string& line) {
    const auto now = Clock::now();
    if (now - last_warning < std::chrono::seconds(1)) {
      ++unwarned;
      return;
    }
    log::warn("rendezvous store: " + line + (unwarned ? " (and " + std::to_string(unwarned) + " more since the last such line)" : ""));
    last_warning = now;
    unwarned = 0;
  }

  bool has_all(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!values.count(k)) return false;
    return true;
  }
};

StoreServer::StoreServer(const Endpoint& at, RunSecret secret, ServerLimits limits)
    : state_(std::make_unique<State>(std::move(secret))) {
  state_->limits = limits;
  Socket s(::socket(at.address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s) throw std::runtime_error("cannot serve the rendezvous store: socket(): " + std::string(std::strerror(errno)));
  const int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // a previous run's closing connections do not hold the port
  if (::bind(s.fd(), reinterpret_cast<const sockaddr*>(&at.address), at.length) != 0) {
    const int error = errno;
    std::string advice;
    if (error == EADDRINUSE) advice = ": another run or program holds this port; choose another MASTER_PORT (`dflash-host launch` picks a free one)";
    if (error == EADDRNOTAVAIL)
      advice = ": it is not an address of this host. Rank 0 serves the store, so run rank 0 on the host MASTER_ADDR names";
    throw std::runtime_error("cannot serve the rendezvous store at " + at.text() + " (" + std::strerror(error) + ")" + advice);
  }
  if (::listen(s.fd(), 512) != 0)
    throw std::runtime_error("cannot serve the rendezvous store at " + at.text() + ": listen(): " + std::strerror(errno));
  address_.length = sizeof address_.address;
  ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&address_.address), &address_.length);
  state_->listener = std::move(s);
  int wake[2];
  if (::pipe2(wake, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error("rendezvous store: pipe2(): " + std::string(std::strerror(errno)));
  state_->wake_read = wake[0];
  state_->wake_write = wake[1];
  thread_ = std::thread([this] { serve(); });
}

StoreServer::~StoreServer() {
  state_->stopping = true;
  const char byte = 1;
  (void)!::write(state_->wake_write, &byte, 1);
  if (thread_.joinable()) thread_.join();
}

namespace {

// Sends what it can of `c.out` now; the rest waits for POLLOUT.
void flush(Connection& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.socket.fd(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c.unsent_since) c.unsent_since = Clock::now();
      return;
    } else {
      c.gone = true;
      return;
    }
  }
  c.unsent_since.reset();
  if (c.close_after_sending) c.gone = true;
}

}  // namespace

void StoreServer::serve() {
  State& s = *state_;
  const milliseconds bound = s.limits.request_bound;

  auto drop = [&](Connection& c, const std::string& why) {
    if (c.gone) return;
    c.gone = true;
    ++dropped_;
    s.warn("dropped the client at " + c.peer + ": " + why);
  };
  auto refuse = [&](Connection& c, const std::string& why, bool answer) {
    ++refused_;
    s.warn("refused the client at " + c.peer + ": " + why);
    if (!answer) {
      c.gone = true;
      return;
    }
    c.out += FrameWriter().byte('R').raw("it did not prove this run's secret").frame();
    c.close_after_sending = true;
  };

  // The reply to a parked get or wait, once its keys are there.
  auto answer_parked = [&](Connection& c) {
    if (!c.parked || !s.has_all(c.parked_keys)) return false;
    if (*c.parked == Op::get) c.out += answer(Reply::value).text(s.values[c.parked_keys[0]]).frame();
    else c.out += reply(Reply::ok);
    c.parked.reset();
    c.parked_keys.clear();
    return true;
  };

  auto handshake = [&](Connection& c, const std::string& payload) {
    if (payload.size() != kMagicBytes + kNonceBytes + 32 || payload.compare(0, kMagicBytes, kMagic, kMagicBytes) != 0)
      return refuse(c, "it does not speak this store's protocol", false);
    const std::string client_nonce = payload.substr(kMagicBytes, kNonceBytes);
    Digest proof;
    std::memcpy(proof.data(), payload.data() + kMagicBytes + kNonceBytes, proof.size());
    if (!s.secret.verify(kClientProof, c.nonce + client_nonce, proof)) return refuse(c, "it did not prove this run's secret", true);
    c.proven = true;
    const Digest mine = s.secret.prove(kServerProof, client_nonce + c.nonce);
    c.out += FrameWriter().byte('O').raw(std::string(mine.begin(), mine.end())).frame();
  };

  // One request of a proven client; true when it changed a key (parked
  // clients may be answered now).
  auto handle = [&](Connection& c, const std::string& payload) {
    FrameReader r(payload);
    const auto op = static_cast<Op>(r.byte());
    bool changed = false;
    switch (op) {
      case Op::set: {
        std::string key = r.text();
        s.values[key] = r.text();
        c.out += reply(Reply::ok);
        changed = true;
        break;
      }
      case Op::get:
      case Op::wait: {
        c.parked = op;
        c.parked_keys = op == Op::get ? std::vector<std::string>{r.text()} : r.texts();
        answer_parked(c);
        break;
      }
      case Op::add: {
        const std::string key = r.text();
        const int64_t delta = r.integer();
        int64_t now = 0;
        if (const auto it = s.values.find(key); it != s.values.end()) {
          try {
            size_t used = 0;
            now = std::stoll(it->second, &used);
            if (used != it->second.size()) throw std::invalid_argument("");
          } catch (const std::exception&) {
            c.out += answer(Reply::error).text("key '" + key + "' does not hold a whole number").frame();
            break;
          }
        }
        now += delta;
        s.values[key] = std::to_string(now);
        c.out += answer(Reply::integer).integer(now).frame();
        changed = true;
        break;
      }
      case Op::check:
        c.out += answer(Reply::boolean).byte(s.has_all(r.texts())).frame();
        break;
      case Op::erase:
        c.out += answer(Reply::boolean).byte(s.values.erase(r.text()) > 0).frame();
        break;
      case Op::num_keys:
        c.out += answer(Reply::integer).integer(static_cast<int64_t>(s.values.size())).frame();
        break;
      case Op::compare_set: {
        // As c10d's stores: set `desired` when the key holds `expected` (or
        // is unset and `expected` is empty); answer what the key holds after.
        const std::string key = r.text(), expected = r.text(), desired = r.text();
        const auto it = s.values.find(key);
        std::string result;
        if (it == s.values.end()) {
          result = expected.empty() ? desired : expected;
          if (expected.empty()) s.values[key] = desired, changed = true;
        } else if (it->second == expected) {
          it->second = desired;
          result = desired;
          changed = true;
        } else {
          result = it->second;
        }
        c.out += answer(Reply::value).text(result).frame();
        break;
      }
      default:
        throw WireError("unknown request " + std::to_string(static_cast<int>(op)));
    }
    if (!r.done()) throw WireError("a request with bytes left over");
    return changed;
  };

  // Every whole frame `c` has sent, in order, until one parks it.
  auto consume = [&](Connection& c) {
    bool changed = false;
    while (!c.gone && !c.parked && !c.close_after_sending && c.in.size() >= 4) {
      const uint32_t n = frame_length(c.in.data());
      if (n > (c.proven ? kLargestFrame : kLargestHandshakeFrame)) {
        if (c.proven) drop(c, "it sent a message of " + std::to_string(n) + " bytes");
        else refuse(c, "it does not speak this store's protocol (its first message announced " + std::to_string(n) + " bytes)", false);
        break;
      }
      if (c.in.size() < 4 + size_t(n)) break;
      const std::string payload = c.in.substr(4, n);
      c.in.erase(0, 4 + size_t(n));
      if (!c.proven) {
        handshake(c, payload);
        continue;
      }
      try {
        changed = handle(c, payload) || changed;
      } catch (const WireError& e) {
        drop(c, std::string("it broke the protocol (") + e.what() + ")");
      }
    }
    // A frame begun and not finished starts the clock (see ServerLimits).
    if (c.in.empty() || c.parked) c.partial_since.reset();
    else if (!c.partial_since) c.partial_since = Clock::now();
    return changed;
  };

  auto accept_all = [&] {
    for (;;) {
      sockaddr_storage from{};
      socklen_t length = sizeof from;
      const int fd = ::accept4(s.listener.fd(), reinterpret_cast<sockaddr*>(&from), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: none left (or a transient error: the next poll retries)
      Endpoint peer;
      peer.address = from;
      peer.length = length;
      Socket socket(fd);
      size_t unproven = 0;
      for (const auto& c : s.connections) unproven += !c.proven && !c.gone;
      if (unproven >= s.limits.most_unproven) {
        ++dropped_;
        s.warn("turned away the client at " + peer.text() + ": " + std::to_string(unproven) + " connections are already waiting to prove the run secret");
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Connection& c = s.connections.emplace_back();
      c.socket = std::move(socket);
      c.peer = peer.text();
      c.accepted = Clock::now();
      c.nonce = random_bytes(kNonceBytes);
      c.out = FrameWriter().raw(std::string(kMagic, kMagicBytes)).raw(c.nonce).frame();
      flush(c);
    }
  };

  std::vector<pollfd> polled;
  while (!s.stopping) {
    polled.clear();
    polled.push_back({s.wake_read, POLLIN, 0});
    polled.push_back({s.listener.fd(), POLLIN, 0});
    auto now = Clock::now();
    auto next = now + std::chrono::seconds(1);
    for (const auto& c : s.connections) {
      polled.push_back({c.socket.fd(), static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      if (!c.proven) next = std::min(next, c.accepted + bound);
      if (c.partial_since) next = std::min(next, *c.partial_since + bound);
      if (c.unsent_since) next = std::min(next, *c.unsent_since + bound);
    }
    const auto wait_ms = std::max<int64_t>(0, std::chrono::duration_cast<milliseconds>(next - now).count() + 1);
    if (::poll(polled.data(), polled.size(), static_cast<int>(wait_ms)) < 0 && errno != EINTR) {
      log::error("rendezvous store: poll() failed: " + std::string(std::strerror(errno)) + "; it stops serving");
      return;
    }
    if (polled[0].revents) {
      char drain[64];
      while (::read(s.wake_read, drain, sizeof drain) > 0) {
      }
      continue;
    }
    bool changed = false;
    size_t i = 2;
    for (auto& c : s.connections) {
      const short events = polled[i++].revents;
      if (events & POLLIN) {
        char buffer[65536];
        // One read a turn: a client that sends without pause cannot keep the loop to itself.
        const ssize_t n = ::recv(c.socket.fd(), buffer, sizeof buffer, 0);
        if (n > 0) c.in.append(buffer, static_cast<size_t>(n));
        else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.gone = true;
        if (!c.gone) changed = consume(c) || changed;
      } else if (events & (POLLHUP | POLLERR | POLLNVAL)) {
        c.gone = true;
      }
      if (!c.gone && !c.out.empty()) flush(c);
    }
    // After the connections polled above (a new one has no entry in `polled`).
    if (polled[1].revents & POLLIN) accept_all();
    // Keys changed: the parked gets and waits whose keys are there now go on.
    while (changed) {
      changed = false;
      for (auto& c : s.connections)
        if (!c.gone && answer_parked(c)) {
          changed = consume(c) || changed;
          flush(c);
        }
    }
    now = Clock::now();
    for (auto& c : s.connections) {
      if (c.gone) continue;
      if (!c.proven && now - c.accepted > bound)
        drop(c, "it did not complete the handshake within " + std::to_string(bound.count()) + " ms");
      else if (c.partial_since && now - *c.partial_since > bound)
        drop(c, "it began a request and did not finish it within " + std::to_string(bound.count()) + " ms");
      else if (c.unsent_since && now - *c.unsent_since > bound)
        drop(c, "it did not read its reply within " + std::to_string(bound.count()) + " ms");
    }
    s.connections.remove_if([](const Connection& c) { return c.gone; });
  }
}

}  // namespace dflash::dist::rendezvous
