// One run per output directory. Two processes training into the same
// train.output_dir would overwrite each other's checkpoints and interleave
// metrics.jsonl, so a run holds an exclusive flock(2) on
// <output_dir>/.dflash-host.lock for its whole life. The file records the
// holder (pid, host, start time) so that a refused run can say who has it.
// The kernel drops a flock when its process dies, however it dies, so a
// lock can never be left held by a dead run; the record a dead run leaves
// behind is noticed and taken over with a log line.
#pragma once

#include <stdexcept>
#include <string>

namespace dflash::checkpoint {

class RunDirectoryInUse : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RunLock {
 public:
  // Takes the lock of `dir` (which must exist). Throws RunDirectoryInUse
  // naming the holder when another process has it.
  explicit RunLock(const std::string& dir);
  ~RunLock();  // clears the record, then releases
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }
  // What a previous holder that did not release the lock had recorded
  // (empty when the lock was released cleanly or never taken).
  const std::string& taken_over() const { return taken_over_; }

 private:
  std::string path_, taken_over_;
  int fd_ = -1;
};

}  // namespace dflash::checkpoint
