// The A/B report's bookkeeping on its own (no plugins, no training): the
// console table keeps every arm's name whole and its columns aligned by
// display width, and curves.csv carries every loss metric the arms logged.
#include "ab/ab_report.h"
#include "support/expect.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace {
using namespace dflash;

ab::ArmRun run_of(const std::string& arm, const std::string& plugin, double loss) {
  ab::ArmRun run;
  run.arm = arm;
  for (int64_t step = 0; step < 3; ++step)
    run.metrics.push_back({{"step", step}, {"loss", loss - 0.1 * static_cast<double>(step)}, {"slot_accuracy", {0.5, 0.25}},
                           {"acceptance_length_sim", 0.625}, {"step_seconds", 0.01}, {"tokens_per_s", 1000.0},
                           {"memory_peak_bytes", 1e6}, {"loss_metrics", {{plugin, {{"ce", 2.5}, {"reverse_kl", 0.75}}}}}});
  return run;
}

// The display column of a byte offset, and the character at a display column.
size_t column_of(const std::string& line, size_t byte) { return ab::display_width(line.substr(0, byte)); }
std::string char_at_column(const std::string& line, size_t column) {
  size_t seen = 0;
  for (size_t byte = 0; byte < line.size(); ++byte) {
    if ((static_cast<unsigned char>(line[byte]) & 0xC0) == 0x80) continue;
    if (seen++ == column) {
      size_t end = byte + 1;
      while (end < line.size() && (static_cast<unsigned char>(line[end]) & 0xC0) == 0x80) ++end;
      return line.substr(byte, end - byte);
    }
  }
  return "";
}

TEST(AbReport, ArmNamesAreWholeAndColumnsAlignByDisplayWidth) {
  // Two valid settings that a cut at 22 characters made look the same.
  const std::vector<std::string> arms = {"reverse_kl-kl_weight=0.5", "reverse_kl-kl_weight=0.25"};
  const std::vector<ab::ArmRun> runs = {run_of(arms[0], "reverse_kl", 3.0), run_of(arms[1], "reverse_kl", 2.0)};
  const std::string table = ab::format_summary(ab::summarize(arms, runs, {}, nlohmann::json::object()));
  std::istringstream lines(table);
  std::string header;
  std::getline(lines, header);
  const size_t first = header.find(arms[0] + " "), second = header.find(arms[1]);
  ASSERT_NE(first, std::string::npos) << table;
  ASSERT_NE(second, std::string::npos) << table;
  // Every row of figures starts each arm's cell at the header's display
  // column, whatever Σ, Π, τ or ± its label holds.
  int rows = 0;
  for (std::string line; std::getline(lines, line) && !line.empty();) {
    ++rows;
    for (size_t column : {column_of(header, first), column_of(header, second)}) {
      EXPECT_EQ(char_at_column(line, column - 1), " ") << "column " << column << ":\n" << table;
      EXPECT_NE(char_at_column(line, column), " ") << "column " << column << ":\n" << table;
    }
  }
  EXPECT_EQ(rows, 8) << "seven figures and the seeds:\n" << table;
  EXPECT_EQ(ab::display_width("Σ Π τ ± –"), 9u);
}

TEST(AbReport, CurvesCarryEveryLossMetricUnderItsPlugin) {
  test::TempDir temp("dflash_ab_report");
  const std::vector<std::string> arms = {"kl", "reverse_kl"};
  std::vector<ab::ArmRun> runs = {run_of("kl", "kl", 3.0), run_of("reverse_kl", "reverse_kl", 2.0)};
  const nlohmann::json summary = ab::summarize(arms, runs, {}, nlohmann::json::object());
  ab::write_report(temp.path().string(), summary, runs);
  std::ifstream csv(temp.path() / "curves.csv");
  std::string header, row;
  std::getline(csv, header);
  EXPECT_CONTAINS(header, ",kl.ce,kl.reverse_kl,reverse_kl.ce,reverse_kl.reverse_kl");
  std::getline(csv, row);
  EXPECT_EQ(row.substr(row.size() - std::string(",2.50000000,0.75000000,,").size()), ",2.50000000,0.75000000,,") << row;
}

}  // namespace
