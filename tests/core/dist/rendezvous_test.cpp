// The rendezvous store (core/dist/rendezvous) on loopback, in one process:
// SHA-256 and HMAC against the published vectors, the run secret, what a
// rank can do with the secret, and what a client without it cannot: read,
// write, or hold the store up. tests/core/dist/distributed_test.cpp does the same
// against the store of a real run of several processes.
#include "dist/rendezvous/run_secret.h"
#include "dist/rendezvous/store_client.h"
#include "dist/rendezvous/store_server.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>

namespace dflash::dist::rendezvous {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

std::string hex_of(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) (out += kHex[c >> 4]) += kHex[c & 15];
  return out;
}

TEST(Sha256, MatchesTheFipsExamples) {
  EXPECT_EQ(to_hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // 56 bytes: the padding spills into a second block.
  EXPECT_EQ(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 million;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update(chunk.data(), 997), million.update(chunk.data(), 3);  // uneven pieces
  EXPECT_EQ(to_hex(million.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, HmacMatchesRfc4231) {
  EXPECT_EQ(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // A key longer than the block is hashed first (test case 6).
  EXPECT_EQ(to_hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Sha256, DigestsReadBackFromHexAndNothingElseDoes) {
  const Digest d = sha256("abc");
  EXPECT_EQ(digest_from_hex(to_hex(d)), d);
  std::string upper = to_hex(d);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(digest_from_hex(upper), d);
  EXPECT_FALSE(digest_from_hex(to_hex(d).substr(1)).has_value()) << "63 digits";
  EXPECT_FALSE(digest_from_hex(to_hex(d).substr(1) + "g").has_value()) << "not a hex digit";
  EXPECT_FALSE(digest_from_hex("").has_value());
}

TEST(RunSecret, IsRandomLongEnoughAndReadOnlyFromAFileNoOneElseCanRead) {
  const RunSecret a = RunSecret::generate(), b = RunSecret::generate();
  EXPECT_EQ(a.text().size(), 64u);
  EXPECT_NE(a.text(), b.text());
  EXPECT_FALSE(a.verify("p", "x", b.prove("p", "x")));
  EXPECT_TRUE(a.verify("p", "x", a.prove("p", "x")));
  EXPECT_FALSE(a.verify("q", "x", a.prove("p", "x"))) << "a proof made for one purpose must not serve another";
  try {
    RunSecret::from_text("short", "$DFLASH_RUN_SECRET");
    FAIL() << "a 5-character secret was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("$DFLASH_RUN_SECRET holds 5 characters"), std::string::npos) << e.what();
  }
  char dir[] = "/tmp/run_secret_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/secret";
  std::ofstream(path) << a.text() << "\n";
  ::unsetenv(kSecretVariable);
  ::setenv(kSecretFileVariable, path.c_str(), 1);
  ::chmod(path.c_str(), 0644);
  try {
    RunSecret::from_environment();
    FAIL() << "a secret file others can read was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("may be read by others (mode 0644)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  ::chmod(path.c_str(), 0600);
  const auto read = RunSecret::from_environment();
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->text(), a.text());
  ::unsetenv(kSecretFileVariable);
  EXPECT_FALSE(RunSecret::from_environment().has_value());
  std::remove(path.c_str());
  ::rmdir(dir);
}

Endpoint loopback() { return resolve("127.0.0.1", 0); }

// A raw TCP connection to `at`, as a client of any kind would open.
int raw_connect(const Endpoint& at) {
  const int fd = ::socket(at.address.ss_family, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&at.address), at.length) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` within `within` (what it sent before is read and dropped).
bool closed_within(int fd, milliseconds within) {
  const auto deadline = Clock::now() + within;
  char buffer[256];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) return true;
    }
  }
  return false;
}

TEST(RendezvousStore, ARankWithTheSecretSetsGetsAddsChecksWaitsAndComparesKeys) {
  const RunSecret secret = RunSecret::generate();
  StoreServer server(loopback(), secret);
  StoreClient a(server.address(), secret, 5s), b(server.address(), secret, 5s);
  a.set("k", std::string("v\0w", 3), 5s);
  EXPECT_EQ(b.get("k", 5s), std::string("v\0w", 3));
  EXPECT_EQ(a.add("n", 2, 5s), 2);
  EXPECT_EQ(b.add("n", 3, 5s), 5);
  EXPECT_EQ(a.get("n", 5s), "5") << "counters read as their decimal text, as c10d's stores keep them";
  EXPECT_TRUE(a.check({"k", "n"}, 5s));
  EXPECT_FALSE(a.check({"k", "absent"}, 5s));
  EXPECT_EQ(a.num_keys(5s), 2);
  EXPECT_EQ(a.compare_set("k", "wrong", "x", 5s), std::string("v\0w", 3));
  EXPECT_EQ(a.compare_set("k", std::string("v\0w", 3), "x", 5s), "x");
  EXPECT_EQ(a.compare_set("new", "", "first", 5s), "first");
  EXPECT_TRUE(a.erase("new", 5s));
  EXPECT_FALSE(a.erase("new", 5s));
  // A get waits for its key; so does a wait for all of its keys.
  auto waiting = std::async(std::launch::async, [&] { return b.get("later", 5s); });
  auto waiting_all = std::async(std::launch::async, [&] {
    StoreClient c(server.address(), secret, 5s);
    c.wait({"later", "later2"}, 5s);
    return true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(waiting.wait_for(0ms), std::future_status::timeout);
  a.set("later", "here", 5s);
  EXPECT_EQ(waiting.get(), "here");
  EXPECT_EQ(waiting_all.wait_for(100ms), std::future_status::timeout);
  a.set("later2", "", 5s);
  EXPECT_TRUE(waiting_all.get());
  EXPECT_EQ(server.counts().refused, 0);
}

TEST(RendezvousStore, ARankWithAnotherSecretIsRefusedWithAClearMessageAndNeitherReadsNorWrites) {
  const RunSecret secret = RunSecret::generate();
  StoreServer server(loopback(), secret);
  StoreClient rank(server.address(), secret, 5s);
  rank.set("dflash/failed/1", "nothing", 5s);
  try {
    StoreClient outsider(server.address(), RunSecret::generate(), 5s);
    FAIL() << "a client with another secret was served";
  } catch (const StoreRefused& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the rendezvous store at " + server.address().text() + " refused this rank"), std::string::npos) << what;
    EXPECT_NE(what.find("$DFLASH_RUN_SECRET"), std::string::npos) << what;
    EXPECT_EQ(what.find(secret.text()), std::string::npos) << "the message must not quote the secret";
  }
  EXPECT_EQ(server.counts().refused, 1);
  EXPECT_EQ(rank.get("dflash/failed/1", 5s), "nothing");
  EXPECT_EQ(rank.num_keys(5s), 1);
}

TEST(RendezvousStore, AClientOfAnotherProtocolIsDroppedAtOnceAndAForgedProofIsRefused) {
  const RunSecret secret = RunSecret::generate();
  StoreServer server(loopback(), secret);
  // c10d's TCPStore client opens with a query type and a 4-byte magic: here
  // that reads as a length far beyond the handshake's, so the server drops
  // it without waiting for more.
  const int tcpstore_like = raw_connect(server.address());
  ASSERT_GE(tcpstore_like, 0);
  const unsigned char validate[] = {0, 0x3c, 0x85, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00};
  ASSERT_EQ(::send(tcpstore_like, validate, sizeof validate, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof validate));
  EXPECT_TRUE(closed_within(tcpstore_like, 1s));
  ::close(tcpstore_like);
  // A client that speaks the protocol but guesses the proof: told no, closed.
  const int guesser = raw_connect(server.address());
  ASSERT_GE(guesser, 0);
  const std::string hello = receive_frame_before(guesser, Clock::now() + 2s, kLargestHandshakeFrame);
  ASSERT_EQ(hello.substr(0, kMagicBytes), std::string(kMagic, kMagicBytes));
  const std::string forged = FrameWriter().raw(std::string(kMagic, kMagicBytes)).raw(std::string(kNonceBytes, 'n')).raw(std::string(32, 'p')).frame();
  send_before(guesser, forged, Clock::now() + 2s);
  const std::string verdict = receive_frame_before(guesser, Clock::now() + 2s, kLargestHandshakeFrame);
  EXPECT_EQ(verdict[0], 'R') << hex_of(verdict);
  EXPECT_TRUE(closed_within(guesser, 1s));
  ::close(guesser);
  EXPECT_EQ(server.counts().refused, 2);
  StoreClient rank(server.address(), secret, 5s);
  EXPECT_EQ(rank.num_keys(5s), 0) << "nothing was written";
}

TEST(RendezvousStore, AHalfOpenClientDelaysNoRequestAndIsDroppedAfterTheBound) {
  const RunSecret secret = RunSecret::generate();
  ServerLimits limits;
  limits.request_bound = 1500ms;
  StoreServer server(loopback(), secret, limits);
  StoreClient rank(server.address(), secret, 5s);
  // One byte of a frame's length, then nothing: the client that froze c10d's TCPStore for everyone.
  const int half_open = raw_connect(server.address());
  ASSERT_GE(half_open, 0);
  ASSERT_EQ(::send(half_open, "\x01", 1, MSG_NOSIGNAL), 1);
  // And a client that proves the secret, then begins a request and stops.
  Socket proven = connect_before(server.address(), Clock::now() + 2s);
  const std::string hello = receive_frame_before(proven.fd(), Clock::now() + 2s, kLargestHandshakeFrame);
  const std::string nonce(kNonceBytes, 'c');
  const Digest proof = secret.prove(kClientProof, hello.substr(kMagicBytes) + nonce);
  send_before(proven.fd(), FrameWriter().raw(std::string(kMagic, kMagicBytes)).raw(nonce).raw(std::string(proof.begin(), proof.end())).frame(),
              Clock::now() + 2s);
  ASSERT_EQ(receive_frame_before(proven.fd(), Clock::now() + 2s, kLargestHandshakeFrame)[0], 'O');
  send_before(proven.fd(), std::string("\x40\x00\x00\x00S", 5), Clock::now() + 2s);  // 64 bytes announced, 1 sent
  // Meanwhile every request of the rank is answered at once (well inside the bound).
  const auto started = Clock::now();
  for (int i = 0; i < 50; ++i) EXPECT_EQ(rank.add("n", 1, 5s), i + 1);
  EXPECT_LT(Clock::now() - started, 1000ms) << "50 requests took longer than the stalled clients' bound";
  // Both are dropped once the bound passes.
  EXPECT_TRUE(closed_within(half_open, 3s));
  EXPECT_TRUE(closed_within(proven.fd(), 3s));
  ::close(half_open);
  EXPECT_EQ(server.counts().dropped, 2);
  EXPECT_EQ(rank.get("n", 5s), "50");
}

TEST(RendezvousStore, ListensOnlyOnTheAddressItIsGiven) {
  const RunSecret secret = RunSecret::generate();
  StoreServer server(loopback(), secret);
  EXPECT_EQ(server.address().host(), "127.0.0.1");
  EXPECT_GT(server.address().port(), 0);
  // This host's other addresses, if it has any, do not reach it.
  ifaddrs* all = nullptr;
  ASSERT_EQ(::getifaddrs(&all), 0);
  int tried = 0;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    Endpoint other;
    std::memcpy(&other.address, i->ifa_addr, sizeof(sockaddr_in));
    other.length = sizeof(sockaddr_in);
    reinterpret_cast<sockaddr_in&>(other.address).sin_port = htons(static_cast<uint16_t>(server.address().port()));
    if (other.is_loopback()) continue;
    ++tried;
    const int fd = raw_connect(other);
    EXPECT_LT(fd, 0) << "the store answered at " << other.text();
    if (fd >= 0) ::close(fd);
  }
  ::freeifaddrs(all);
  if (tried == 0) std::cout << "[ note     ] this host has no IPv4 address but loopback: only the bound address was checked\n";
}

TEST(RendezvousStore, AStalledStoreIsReportedNamingItsAddressWithinTheTimeout) {
  // A program that accepts connections and never answers.
  Socket mute(::socket(AF_INET, SOCK_STREAM, 0));
  Endpoint at = loopback();
  ASSERT_EQ(::bind(mute.fd(), reinterpret_cast<const sockaddr*>(&at.address), at.length), 0);
  ASSERT_EQ(::listen(mute.fd(), 8), 0);
  at.length = sizeof at.address;
  ::getsockname(mute.fd(), reinterpret_cast<sockaddr*>(&at.address), &at.length);
  const auto started = Clock::now();
  try {
    StoreClient rank(at, RunSecret::generate(), 700ms);
    FAIL() << "a store that never answers was used";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("the rendezvous store at " + at.text() + " did not greet this rank in time"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(Clock::now() - started, 3s);

  // The run's own store, asked for a key no one sets: the request is named.
  const RunSecret secret = RunSecret::generate();
  StoreServer server(loopback(), secret);
  StoreClient rank(server.address(), secret, 5s);
  try {
    rank.get("dflash/heartbeat/3", 300ms);
    FAIL() << "a get of a key never set returned";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("did not answer get 'dflash/heartbeat/3' within 300 ms"), std::string::npos) << e.what();
  }
  rank.set("after", "a timeout", 5s);  // the connection is made anew
  EXPECT_EQ(rank.get("after", 5s), "a timeout");
}

TEST(RendezvousStore, ARankFindsAStoreThatStartsAfterItAndRefusesAnImpostor) {
  const RunSecret secret = RunSecret::generate();
  // The port of a store not started yet.
  Endpoint at;
  {
    StoreServer probe(loopback(), secret);
    at = probe.address();
  }
  auto joined = std::async(std::launch::async, [&] {
    StoreClient rank(at, secret, 10s);
    return rank.get("hello", 10s);
  });
  std::this_thread::sleep_for(300ms);
  StoreServer late(at, secret);
  StoreClient zero(at, secret, 5s);
  zero.set("hello", "world", 5s);
  EXPECT_EQ(joined.get(), "world");

  // A store of another run (another secret) on the port this rank was given.
  StoreServer impostor(loopback(), RunSecret::generate());
  try {
    StoreClient rank(impostor.address(), secret, 5s);
    FAIL() << "a rank trusted a store of another secret";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this rank"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dflash::dist::rendezvous
