// `dflash-host generate`: the config's target answers every prompt itself,
// and the answers become training lines (prompt masked, answer supervised) —
// what SpecForge calls regenerating the data. Flags and paths are checked
// before any plugin loads; the lines replace --out only once all are written.
#include "cli/commands.h"
#include "eval/prompts.h"
#include "generate/generation.h"
#include "generate/lines_file.h"
#include "generate/output.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

namespace dflash::cli {
namespace fs = std::filesystem;
namespace {

// Everything about the command line that can be wrong before a plugin loads.
void check_generate_flags(const CliOptions& options) {
  if (!options.config_file) throw std::invalid_argument("generate needs a config with a target section: --config FILE.json");
  if (!options.prompts)
    throw std::invalid_argument("generate needs prompts: --prompts FILE.jsonl (one {\"prompt_ids\": [...]}, "
                                "{\"input_ids\": [...]} or {\"text\": \"...\"} per line)");
  if (!options.out_dir)
    throw std::invalid_argument("generate needs an output file: --out FILE.jsonl (the training lines it writes)");
  const bool sampling = options.temperature.value_or(0) > 0;
  if (!sampling && options.top_p)
    throw std::invalid_argument("--top-p applies to sampling; add --temperature T (above 0), or drop --top-p for greedy decoding");
  if (!sampling && options.seed)
    throw std::invalid_argument("--seed applies to sampling; add --temperature T (above 0), or drop --seed for greedy decoding");
  eval::check_prompts_file(*options.prompts);
  eval::check_output_file(*options.out_dir, "--out");
  std::error_code ec;
  if (fs::equivalent(*options.prompts, *options.out_dir, ec))
    throw std::invalid_argument("--out " + *options.out_dir + " is the prompts file; write the training lines to another file");
  if (options.report) {
    eval::check_output_file(*options.report, "--report");
    if (fs::absolute(*options.report).lexically_normal() == fs::absolute(*options.out_dir).lexically_normal())
      throw std::invalid_argument("--report " + *options.report + " is the --out file; give the report another name");
  }
}

generate::GenerateSettings settings_of(const CliOptions& options, const nlohmann::json& target_info,
                                       const train::TrainSettings& train) {
  generate::GenerateSettings s;
  s.limits.max_new_tokens = options.max_new_tokens;
  s.limits.max_length = options.max_length > 0 ? options.max_length : target_info.value("max_position_embeddings", int64_t{0});
  s.limits.eos_token_ids = target_info.value("eos_token_ids", std::vector<int64_t>{});
  s.batch_size = options.batch_size;
  s.sampling.temperature = options.temperature.value_or(0);
  s.sampling.top_p = options.top_p.value_or(1);
  s.sampling.seed = options.seed ? static_cast<uint64_t>(*options.seed) : train.seed;
  return s;
}

}  // namespace

int run_generate(const CliOptions& options) {
  check_generate_flags(options);
  const host::PluginRegistry registry = find_plugins(options);
  const TargetOnly made = make_target(options, registry);
  const nlohmann::json target_info = made.target->describe();
  // A training line's prompt is what precedes its answer: the answer is what
  // the target writes anew.
  const std::vector<eval::Prompt> prompts = eval::read_prompts(
      eval::PromptSettings{*options.prompts, options.prompt_tokens, options.max_prompts, /*split_at_loss_mask=*/true},
      target_info);
  const generate::GenerateSettings settings = settings_of(options, target_info, made.settings);

  generate::LinesFile lines(*options.out_dir);
  int64_t short_answers = 0;
  const generate::GenerateStats stats =
      generate::generate(*made.target, prompts, *options.prompts, settings, [&](generate::Answer&& answer) {
        short_answers += answer.tokens.size() < 2;
        lines.add(answer.prompt_index, generate::training_line(prompts[answer.prompt_index], answer));
      });
  lines.commit(prompts.size());

  const nlohmann::json report = generate::report_json(stats, settings, made.target->record().name, *options.prompts,
                                                      *options.out_dir, short_answers);
  std::cout << generate::format_report(report);
  if (options.report) {
    std::ofstream out(*options.report);
    if (!(out << report.dump(2) << "\n")) throw std::runtime_error(*options.report + ": cannot write the report");
    std::cout << "  report: " << *options.report << "\n";
  }
  return kExitOk;
}

}  // namespace dflash::cli
