#include "checkpoint/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

namespace dflash::checkpoint {
namespace {

std::string read_all(int fd) {
  std::string text;
  char chunk[512];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t got; (got = ::read(fd, chunk, sizeof chunk)) > 0 && text.size() < 4096;) text.append(chunk, static_cast<size_t>(got));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

std::string holder_record() {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  return "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when + "\n";
}

}  // namespace

RunLock::RunLock(const std::string& dir) : path_(dir + "/.dflash-host.lock") {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error(path_ + ": cannot create the run's lock file (" + std::strerror(errno) +
                             "); check that train.output_dir is writable");
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int error = errno;
    const std::string holder = error == EWOULDBLOCK ? read_all(fd_) : "";
    ::close(fd_);
    fd_ = -1;
    if (error != EWOULDBLOCK)
      throw std::runtime_error(path_ + ": cannot lock (" + std::strerror(error) + ")");
    throw RunDirectoryInUse("train.output_dir " + dir + " is in use by another run (" +
                            (holder.empty() ? std::string("holder not yet recorded") : holder) +
                            "); wait for it to finish, stop it, or give this run another train.output_dir");
  }
  taken_over_ = read_all(fd_);
  const std::string record = holder_record();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size()))
    throw std::runtime_error(path_ + ": cannot write the run's lock file (" + std::strerror(errno) + ")");
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  // An empty record means "released cleanly"; only a run that died leaves one.
  if (::ftruncate(fd_, 0) != 0) { /* the lock is released below all the same */ }
  ::close(fd_);
}

}  // namespace dflash::checkpoint
