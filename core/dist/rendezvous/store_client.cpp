#include "dist/rendezvous/store_client.h"

#include <cstring>
#include <thread>

namespace dflash::dist::rendezvous {

namespace {

using std::chrono::milliseconds;

std::string seconds_text(milliseconds timeout) {
  const int64_t ms = timeout.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

}  // namespace

StoreClient::StoreClient(Endpoint server, RunSecret secret, milliseconds timeout)
    : server_(std::move(server)), secret_(std::move(secret)) {
  std::lock_guard<std::mutex> lock(mutex_);
  connect(Clock::now() + timeout, true);
}

void StoreClient::connect(Clock::time_point deadline, bool patient) {
  const auto started = Clock::now();
  std::string last = "no attempt";
  for (;;) {
    try {
      socket_ = connect_before(server_, deadline);
      break;
    } catch (const WireTimeout&) {
      last = "no answer";
    } catch (const WireError& e) {
      last = e.what();  // refused: rank 0 may not serve yet
      if (!patient)
        throw StoreError("the rendezvous store at " + server_.text() + " no longer accepts connections (" + last +
                         "): rank 0, which serves it, has exited");
    }
    if (Clock::now() + milliseconds(100) >= deadline)
      throw StoreError("could not reach the rendezvous store at " + server_.text() + " within " +
                       seconds_text(std::chrono::duration_cast<milliseconds>(deadline - started)) + " (" + last +
                       "): is rank 0 running, and are MASTER_ADDR and MASTER_PORT its address?");
    std::this_thread::sleep_for(milliseconds(100));
  }
  try {
    prove(deadline);
  } catch (...) {
    socket_.reset();
    throw;
  }
}

void StoreClient::prove(Clock::time_point deadline) {
  const std::string at = "the rendezvous store at " + server_.text();
  std::string hello;
  try {
    hello = receive_frame_before(socket_.fd(), deadline, kLargestHandshakeFrame);
  } catch (const WireTimeout&) {
    throw StoreError(at + " did not greet this rank in time: it is stalled, or another program holds the port");
  } catch (const WireError& e) {
    throw StoreError(at + " closed the connection before the handshake (" + e.what() +
                     "): it turned this rank away (too many connections waiting?) or is not a dflash-host store");
  }
  if (hello.size() != kMagicBytes + kNonceBytes || hello.compare(0, kMagicBytes, kMagic, kMagicBytes) != 0)
    throw StoreError("the program answering at " + server_.text() +
                     " is not a dflash-host rendezvous store (another service holds the port? choose another MASTER_PORT)");
  const std::string server_nonce = hello.substr(kMagicBytes), client_nonce = random_bytes(kNonceBytes);
  const Digest proof = secret_.prove(kClientProof, server_nonce + client_nonce);
  send_before(socket_.fd(), FrameWriter().raw(std::string(kMagic, kMagicBytes)).raw(client_nonce).raw(std::string(proof.begin(), proof.end())).frame(),
              deadline);
  std::string verdict;
  try {
    verdict = receive_frame_before(socket_.fd(), deadline, kLargestHandshakeFrame);
  } catch (const WireError& e) {
    throw StoreError(at + " did not answer this rank's proof (" + e.what() + ")");
  }
  if (!verdict.empty() && verdict[0] == 'R')
    throw StoreRefused(at + " refused this rank: " + verdict.substr(1) + ". Every rank of a run needs the same $" + kSecretVariable +
                       " as rank 0 (`dflash-host launch` gives its ranks one; under torchrun export the same value on every "
                       "node, or name a file only you can read in $" + kSecretFileVariable + ")");
  Digest theirs{};
  if (verdict.size() != 1 + theirs.size() || verdict[0] != 'O')
    throw StoreError(at + " answered the handshake with something else: it is not this run's store");
  std::memcpy(theirs.data(), verdict.data() + 1, theirs.size());
  if (!secret_.verify(kServerProof, client_nonce + server_nonce, theirs))
    throw StoreError("the program answering at " + server_.text() +
                     " could not prove this run's secret: it is not this run's store (another run, or a program posing as "
                     "one, holds the port)");
}

std::string StoreClient::request(const std::string& frame, const std::string& what, milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto deadline = Clock::now() + timeout;
  if (!socket_) connect(deadline, false);
  try {
    send_before(socket_.fd(), frame, deadline);
    std::string answer = receive_frame_before(socket_.fd(), deadline, kLargestFrame);
    if (!answer.empty() && answer[0] == static_cast<char>(Reply::error)) {
      std::string copy = answer.substr(1);
      FrameReader r(copy);
      throw StoreError("the rendezvous store at " + server_.text() + " refused " + what + ": " + r.text());
    }
    return answer;
  } catch (const WireTimeout&) {
    socket_.reset();  // its answer may still come: this connection is out of step now
    throw StoreError("the rendezvous store at " + server_.text() + " did not answer " + what + " within " + seconds_text(timeout) +
                     " (train.collective_timeout_s): the key was never set, or the store is stalled (rank 0, which serves it, "
                     "is stopped or overloaded)");
  } catch (const WireError& e) {
    socket_.reset();
    throw StoreError("the rendezvous store at " + server_.text() + " failed during " + what + " (" + e.what() +
                     "): rank 0, which serves it, has exited or dropped this rank");
  }
}

namespace {

FrameWriter op(Op which) {
  FrameWriter w;
  w.byte(static_cast<uint8_t>(which));
  return w;
}

// The reply's body after its kind byte, checked to be `kind`.
std::string body(const std::string& answer, Reply kind, const std::string& what) {
  if (answer.empty() || answer[0] != static_cast<char>(kind)) throw StoreError("the rendezvous store answered " + what + " out of turn");
  return answer.substr(1);
}

std::string quoted(const std::string& key) { return "'" + key + "'"; }

}  // namespace

void StoreClient::set(const std::string& key, const std::string& value, milliseconds timeout) {
  const std::string what = "set " + quoted(key);
  body(request(op(Op::set).text(key).text(value).frame(), what, timeout), Reply::ok, what);
}

std::string StoreClient::get(const std::string& key, milliseconds timeout) {
  const std::string what = "get " + quoted(key);
  const std::string b = body(request(op(Op::get).text(key).frame(), what, timeout), Reply::value, what);
  return FrameReader(b).text();
}

int64_t StoreClient::add(const std::string& key, int64_t delta, milliseconds timeout) {
  const std::string what = "add " + quoted(key);
  const std::string b = body(request(op(Op::add).text(key).integer(delta).frame(), what, timeout), Reply::integer, what);
  return FrameReader(b).integer();
}

bool StoreClient::check(const std::vector<std::string>& keys, milliseconds timeout) {
  const std::string what = "check " + (keys.empty() ? std::string("(no keys)") : quoted(keys[0]));
  return body(request(op(Op::check).texts(keys).frame(), what, timeout), Reply::boolean, what) == std::string(1, '\1');
}

bool StoreClient::erase(const std::string& key, milliseconds timeout) {
  const std::string what = "delete " + quoted(key);
  return body(request(op(Op::erase).text(key).frame(), what, timeout), Reply::boolean, what) == std::string(1, '\1');
}

int64_t StoreClient::num_keys(milliseconds timeout) {
  const std::string b = body(request(op(Op::num_keys).frame(), "the count of keys", timeout), Reply::integer, "the count of keys");
  return FrameReader(b).integer();
}

void StoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  std::string what = "wait for";
  for (size_t i = 0; i < keys.size() && i < 3; ++i) what += (i ? ", " : " ") + quoted(keys[i]);
  if (keys.size() > 3) what += " and " + std::to_string(keys.size() - 3) + " more";
  body(request(op(Op::wait).texts(keys).frame(), what, timeout), Reply::ok, what);
}

std::string StoreClient::compare_set(const std::string& key, const std::string& expected, const std::string& desired,
                                     milliseconds timeout) {
  const std::string what = "compare-set " + quoted(key);
  const std::string b =
      body(request(op(Op::compare_set).text(key).text(expected).text(desired).frame(), what, timeout), Reply::value, what);
  return FrameReader(b).text();
}

}  // namespace dflash::dist::rendezvous
