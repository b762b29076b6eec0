#include "metrics/progress.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace dflash::metrics {

MetricsFile::MetricsFile(const std::string& path, int64_t first_step) : path_(path) {
  std::vector<std::string> kept;
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.value("step", int64_t{-1}) < first_step) kept.push_back(line);
    }
  }
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) throw std::runtime_error(path + ": cannot write the metrics file");
  for (const auto& line : kept) std::fprintf(file_, "%s\n", line.c_str());
  std::fflush(file_);
}

MetricsFile::~MetricsFile() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsFile::write(const nlohmann::json& record) {
  const std::string line = record.dump();
  std::fprintf(file_, "%s\n", line.c_str());
  std::fflush(file_);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buffer[32];
  if (s >= 3600) std::snprintf(buffer, sizeof buffer, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s % 3600 / 60));
  else if (s >= 60) std::snprintf(buffer, sizeof buffer, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else std::snprintf(buffer, sizeof buffer, "%llds", static_cast<long long>(s));
  return buffer;
}

ConsoleProgress::ConsoleProgress(const std::string& mode, int64_t first_step, int64_t total_steps, int64_t log_every)
    : mode_(mode == "bar" || (mode == "auto" && ::isatty(STDERR_FILENO)) ? Mode::kBar : Mode::kLines),
      first_step_(first_step), total_(total_steps), log_every_(log_every), start_(std::chrono::steady_clock::now()) {}

void ConsoleProgress::update(const nlohmann::json& r) {
  const int64_t step = r.at("step").get<int64_t>();
  const int64_t done = step + 1 - first_step_;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - step - 1) : NAN;
  char stats[256];
  std::snprintf(stats, sizeof stats, "loss %.4f  acc1 %.3f  τsim %.3f  lr %.2e  |g| %.3f  %.0f tok/s",
                r.value("loss", NAN), r.contains("slot_accuracy") && !r["slot_accuracy"].empty() ? r["slot_accuracy"][0].get<double>() : NAN,
                r.value("acceptance_length_sim", NAN), r.value("lr", NAN), r.value("grad_norm", NAN), r.value("tokens_per_s", NAN));
  if (mode_ == Mode::kBar) {
    const int width = 24;
    const int filled = total_ > 0 ? static_cast<int>(width * (step + 1) / total_) : 0;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r[%s] %lld/%lld  %s  ETA %s\033[K", bar.c_str(), static_cast<long long>(step + 1),
                 static_cast<long long>(total_), stats, format_duration(eta).c_str());
    std::fflush(stderr);
    bar_drawn_ = true;
  } else if ((step + 1) % log_every_ == 0 || step + 1 == total_ || done == 1) {
    std::fprintf(stderr, "step %lld/%lld  %s  elapsed %s  ETA %s%s\n", static_cast<long long>(step + 1),
                 static_cast<long long>(total_), stats, format_duration(elapsed).c_str(), format_duration(eta).c_str(),
                 r.value("skipped", false) ? "  (update skipped: non-finite)" : "");
  }
}

void ConsoleProgress::message(const std::string& line) {
  if (bar_drawn_) std::fprintf(stderr, "\n");
  bar_drawn_ = false;
  std::fprintf(stderr, "%s\n", line.c_str());
}

void ConsoleProgress::finish() {
  if (bar_drawn_) std::fprintf(stderr, "\n");
  bar_drawn_ = false;
}

}  // namespace dflash::metrics
