// The A/B report: per-arm summaries across seeds, a plain-language verdict
// against the first arm, the step-0 gradient check, and the files a
// researcher keeps (results.json, curves.csv, a self-contained report.html).
// Pure bookkeeping over metrics records: no plugins, testable on its own.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dflash::ab {

// One training run of one arm with one seed.
struct ArmRun {
  std::string arm;  // the arm's name
  int64_t seed = 0;
  bool failed = false;
  std::string failure;                   // why, when failed
  std::vector<nlohmann::json> metrics;   // metrics.jsonl records, in step order
  nlohmann::json final_eval;             // eval::evaluate's report at the end, or null
};

// Two arms' step-0 gradients compared (same batch, same initial drafter).
struct GradientCheck {
  std::string a, b;
  double cosine = 0, max_relative_difference = 0;
  bool equal = false;  // within the tolerance the report states
};

// Summary statistics of each arm over its seeds, the verdicts, and the check.
nlohmann::json summarize(const std::vector<std::string>& arms, const std::vector<ArmRun>& runs,
                         const std::vector<GradientCheck>& checks, const nlohmann::json& settings);

// results.json (the summary plus every run's curves), curves.csv (one row per
// arm, seed and step) and report.html (inline SVG, no network) in `dir`.
void write_report(const std::string& dir, const nlohmann::json& summary, const std::vector<ArmRun>& runs);

// The summary table the console prints: columns as wide as their widest
// cell (arm names whole), aligned by display width.
std::string format_summary(const nlohmann::json& summary);

// Terminal columns of UTF-8 text: one per code point.
size_t display_width(const std::string& text);

}  // namespace dflash::ab
