// Where every line of a set of JSON-lines files starts and how long it is,
// found by one streaming scan (a 1 MiB buffer; the files are never held in
// memory), so lines can be read in any order: 24 bytes per line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace dflash::data {

struct LineRef {
  uint64_t offset;  // byte offset of the line in its file
  uint64_t length;  // bytes up to (not including) its newline
  uint32_t file;    // index into LineIndex::files()
  uint32_t line;    // 1-based line number, for messages
};

class LineIndex {
 public:
  // `path`: one file, or a directory whose *.jsonl files are taken in name
  // order. Blank lines are not indexed. Throws naming the path on any error.
  explicit LineIndex(const std::string& path);

  const std::vector<std::string>& files() const { return files_; }
  const std::vector<LineRef>& lines() const { return lines_; }
  uint64_t blank_lines() const { return blank_lines_; }

  // The bytes of one line, without its newline or a final '\r'. Read by
  // length, so a NUL byte is kept as a byte (the caller judges it), never
  // taken as the end of the line. Throws naming the file when the file has
  // shrunk or changed since the scan.
  std::string read(const LineRef& ref);

 private:
  std::vector<std::string> files_;
  std::vector<LineRef> lines_;
  std::vector<std::unique_ptr<std::FILE, int (*)(std::FILE*)>> open_;
  uint64_t blank_lines_ = 0;
};

}  // namespace dflash::data
