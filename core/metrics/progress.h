// Where each step's metrics go: one JSON line per step in metrics.jsonl, and
// the console — a progress bar with ETA on a terminal, plain lines otherwise.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace dflash::metrics {

// A write to metrics.jsonl that failed (a full disk, a quota, an I/O
// error). The file is left ending at the last whole record.
class MetricsWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class MetricsFile {
 public:
  // Opens path for appending, keeping only the records whose "step" is below
  // first_step: a resumed run rewrites what came after its checkpoint. That
  // rewrite goes through a temporary file and a rename, so a crash during it
  // loses nothing. Throws naming the file when it is not a regular file or
  // cannot be written.
  MetricsFile(const std::string& path, int64_t first_step);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  // Appends one line with a single write; on failure truncates back to the
  // last whole record and throws MetricsWriteError.
  void write(const nlohmann::json& record);

 private:
  int fd_ = -1;
  std::string path_;
};

class ConsoleProgress {
 public:
  enum class Mode { kBar, kLines, kQuiet };
  // mode "auto": a bar when stderr is a terminal; "quiet": nothing (the
  // ranks other than 0 of a data-parallel run).
  ConsoleProgress(const std::string& mode, int64_t first_step, int64_t total_steps, int64_t log_every);
  void update(const nlohmann::json& record);
  void message(const std::string& line);  // a line that does not disturb the bar
  void finish();

 private:
  Mode mode_;
  int64_t first_step_, total_, log_every_;
  std::chrono::steady_clock::time_point start_;
  bool bar_drawn_ = false;
};

// "1h02m", "3m04s", "12s"
std::string format_duration(double seconds);

}  // namespace dflash::metrics
