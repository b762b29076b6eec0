// Where each step's metrics go: one JSON line per step in metrics.jsonl, and
// the console — a progress bar with ETA on a terminal, plain lines otherwise.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <string>

namespace dflash::metrics {

class MetricsFile {
 public:
  // Opens path for appending; keeps only the lines whose "step" is below
  // first_step (a resumed run rewrites what came after its checkpoint).
  MetricsFile(const std::string& path, int64_t first_step);
  void write(const nlohmann::json& record);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;

 public:
  ~MetricsFile();
};

class ConsoleProgress {
 public:
  enum class Mode { kBar, kLines };
  // mode "auto": a bar when stderr is a terminal.
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
