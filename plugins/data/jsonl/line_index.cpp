#include "line_index.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace dflash::data {
namespace {

std::runtime_error io_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what + " (" + std::strerror(errno) + ")");
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

LineIndex::LineIndex(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw io_error(path, "cannot read");
  if (S_ISDIR(st.st_mode)) {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) throw io_error(path, "cannot list the directory");
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (ends_with(name, ".jsonl")) files_.push_back(path + "/" + name);
    }
    ::closedir(dir);
    std::sort(files_.begin(), files_.end());
    if (files_.empty()) throw std::runtime_error(path + ": the directory holds no *.jsonl file");
  } else {
    files_.push_back(path);
  }
  if (files_.size() > std::numeric_limits<uint32_t>::max()) throw std::runtime_error(path + ": too many files");

  std::vector<char> buffer(1 << 20);
  for (uint32_t f = 0; f < files_.size(); ++f) {
    std::FILE* file = std::fopen(files_[f].c_str(), "rb");
    if (file == nullptr) throw io_error(files_[f], "cannot open");
    open_.emplace_back(file, &std::fclose);
    uint64_t offset = 0, line_start = 0;
    uint32_t line = 1;
    bool blank = true;  // only whitespace so far on this line
    size_t got;
    while ((got = std::fread(buffer.data(), 1, buffer.size(), file)) > 0) {
      for (size_t i = 0; i < got; ++i, ++offset) {
        const char c = buffer[i];
        if (c == '\n') {
          if (blank) ++blank_lines_;
          else lines_.push_back({line_start, offset - line_start, f, line});
          if (line == std::numeric_limits<uint32_t>::max()) throw std::runtime_error(files_[f] + ": more than 2^32 lines");
          ++line;
          line_start = offset + 1;
          blank = true;
        } else if (blank && c != ' ' && c != '\t' && c != '\r') {
          blank = false;
        }
      }
    }
    if (std::ferror(file)) throw io_error(files_[f], "read failed");
    if (!blank) lines_.push_back({line_start, offset - line_start, f, line});  // a last line without a newline
  }
}

std::string LineIndex::read(const LineRef& ref) {
  // By length, not fgets: fgets stops at nothing but '\n' and hands back a C
  // string, so a NUL byte silently cut the line short and the read went on
  // into the next line.
  std::FILE* file = open_[ref.file].get();
  if (::fseeko(file, static_cast<off_t>(ref.offset), SEEK_SET) != 0) throw io_error(files_[ref.file], "seek failed");
  std::string text(ref.length, '\0');
  const size_t got = std::fread(text.data(), 1, text.size(), file);
  if (std::ferror(file)) throw io_error(files_[ref.file], "read failed");
  if (got != text.size())
    throw std::runtime_error(files_[ref.file] + ":" + std::to_string(ref.line) +
                             ": the file is shorter than when it was indexed; was it changed during the run?");
  if (!text.empty() && text.back() == '\r') text.pop_back();  // a CRLF line ending
  return text;
}

}  // namespace dflash::data
