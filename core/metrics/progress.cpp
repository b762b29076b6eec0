#include "metrics/progress.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cmath>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace dflash::metrics {

namespace {

std::string errno_text() { return std::strerror(errno); }

// The records of an existing metrics file that a run starting at first_step
// keeps, and whether anything else (later steps, a torn last line) is there.
struct KeptRecords {
  std::vector<std::string> lines;
  bool drops_some = false;
};
KeptRecords read_kept(const std::string& path, int64_t first_step) {
  KeptRecords kept;
  std::ifstream in(path, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() < first_step)
      kept.lines.push_back(line);
    else
      kept.drops_some = true;
  }
  return kept;
}

void write_all(int fd, const std::string& text, const std::string& path) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t wrote = ::write(fd, text.data() + done, text.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) throw MetricsWriteError(path + ": cannot write (" + (wrote < 0 ? errno_text() : "no space written") + ")");
    done += static_cast<size_t>(wrote);
  }
}

// Replaces path by the kept records: temporary file, fsync, rename.
void rewrite(const std::string& path, const std::vector<std::string>& lines) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(tmp + ": cannot write the metrics file (" + errno_text() + ")");
  try {
    std::string text;
    for (const auto& line : lines) text += line + "\n";
    write_all(fd, text, tmp);
    if (::fsync(fd) != 0) throw MetricsWriteError(tmp + ": cannot sync (" + errno_text() + ")");
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error(path + ": cannot replace the metrics file (" + errno_text() + ")");
}

}  // namespace

MetricsFile::MetricsFile(const std::string& path, int64_t first_step) : path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode))
      throw std::runtime_error(path + ": exists and is not a regular file; move it away so the run can write its metrics");
    const KeptRecords kept = read_kept(path, first_step);
    if (kept.drops_some) rewrite(path, kept.lines);
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot write the metrics file (" + errno_text() + ")");
}

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsFile::write(const nlohmann::json& record) {
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  try {
    write_all(fd_, line, path_);
  } catch (const MetricsWriteError&) {
    // Leave no torn line behind: the file ends at the last whole record.
    if (before >= 0 && ::ftruncate(fd_, before) != 0) { /* the reader skips a torn last line all the same */ }
    throw;
  }
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
    : mode_(mode == "quiet" ? Mode::kQuiet
            : mode == "bar" || (mode == "auto" && ::isatty(STDERR_FILENO)) ? Mode::kBar
                                                                           : Mode::kLines),
      first_step_(first_step), total_(total_steps), log_every_(log_every), start_(std::chrono::steady_clock::now()) {}

void ConsoleProgress::update(const nlohmann::json& r) {
  if (mode_ == Mode::kQuiet) return;
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
  if (mode_ == Mode::kQuiet) return;
  if (bar_drawn_) std::fprintf(stderr, "\n");
  bar_drawn_ = false;
  std::fprintf(stderr, "%s\n", line.c_str());
}

void ConsoleProgress::finish() {
  if (bar_drawn_) std::fprintf(stderr, "\n");
  bar_drawn_ = false;
}

}  // namespace dflash::metrics
