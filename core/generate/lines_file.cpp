#include "generate/lines_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fcntl.h>
#include <unistd.h>

namespace dflash::generate {
namespace {

std::runtime_error io_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what + " (" + std::strerror(errno) + ")");
}

// Makes the rename durable. Some filesystems refuse fsync on a folder
// (EINVAL); the rename is then as durable as they make it.
void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

LinesFile::LinesFile(std::string path) : path_(std::move(path)) {
  temporary_ = path_ + ".tmp-" + std::to_string(::getpid());
  // O_EXCL: never write into a file something else holds open; a leftover of
  // a killed run with the same pid is replaced (it was never the output).
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0 && errno == EEXIST && ::unlink(temporary_.c_str()) == 0)
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw io_error(temporary_, "cannot create the temporary output file");
}

LinesFile::~LinesFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());
}

void LinesFile::add(size_t index, std::string line) {
  if (index < next_ || held_.count(index))
    throw std::logic_error("LinesFile: line " + std::to_string(index) + " added twice");
  line.push_back('\n');
  held_.emplace(index, std::move(line));
  write_ready();
}

void LinesFile::write_ready() {
  for (auto it = held_.find(next_); it != held_.end(); it = held_.find(next_)) {
    const std::string& text = it->second;
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw io_error(temporary_, "cannot write");
      done += static_cast<size_t>(n);
    }
    held_.erase(it);
    ++next_;
  }
}

void LinesFile::commit(size_t lines) {
  if (next_ != lines || !held_.empty())
    throw std::logic_error("LinesFile: " + std::to_string(next_) + " of " + std::to_string(lines) + " lines written");
  if (::fsync(fd_) != 0) throw io_error(temporary_, "cannot sync");
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw io_error(temporary_, "cannot close");
  }
  fd_ = -1;
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) throw io_error(path_, "cannot rename the finished output into place");
  committed_ = true;
  const std::filesystem::path folder = std::filesystem::path(path_).parent_path();
  sync_folder(folder.empty() ? "." : folder.string());
}

}  // namespace dflash::generate
