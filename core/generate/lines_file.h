// The file `dflash-host generate` writes: JSON lines in prompt order, whatever
// order the prompts finish in (continuous batching finishes short answers
// first), so the same prompts and settings give the same file at any batch
// size. Lines go to a temporary file beside the destination, which replaces
// the destination only once every line is written and synced: a reader never
// sees a partial file or a torn line, and a run that fails or is killed
// leaves an earlier file of that name as it was.
#pragma once

#include <cstddef>
#include <map>
#include <string>

namespace dflash::generate {

class LinesFile {
 public:
  // Creates the temporary file (<path>.tmp-<pid>) in the destination's folder;
  // throws std::runtime_error naming it when that fails.
  explicit LinesFile(std::string path);
  // Removes the temporary file unless commit() ran.
  ~LinesFile();
  LinesFile(const LinesFile&) = delete;
  LinesFile& operator=(const LinesFile&) = delete;

  // Line number `index` (0-based, each once), without its newline. Written as
  // soon as every line before it is; held until then.
  void add(size_t index, std::string line);
  // Every line 0 … lines − 1 added: syncs the file, renames it over the
  // destination and syncs the folder. Throws if a line is missing.
  void commit(size_t lines);

  const std::string& temporary_path() const { return temporary_; }

 private:
  void write_ready();

  std::string path_, temporary_;
  int fd_ = -1;
  bool committed_ = false;
  size_t next_ = 0;                      // the next line to write
  std::map<size_t, std::string> held_;  // finished lines waiting for an earlier one
};

}  // namespace dflash::generate
