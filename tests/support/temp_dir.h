// A fresh temporary folder per test, removed with everything in it.
// POSIX only (mkdtemp, nftw): on the GPU machine, binaries linking the CUDA
// LibTorch crashed inside std::filesystem::create_directories/remove_all
// (see the closing note of 2026-11-30), so tests stay off those calls.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

namespace dflash::test {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "dflash") {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/" + prefix + "_XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (mkdtemp(buffer.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = buffer.data();
  }
  ~TempDir() {
    nftw(path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // A subfolder, created (mkdir -p, one level at a time).
  std::filesystem::path folder(const std::string& name) const {
    std::filesystem::path p = path_;
    for (const auto& part : std::filesystem::path(name)) {
      p /= part;
      ::mkdir(p.c_str(), 0755);
    }
    return p;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace dflash::test
