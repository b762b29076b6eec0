// `dflash-host ab`: one training arm per --loss (or per --drafter), each seed
// run once per arm from the same data order and target (and, between arms of
// one drafter, the same initial drafter); a step-0 gradient check between
// arms whose drafters have the same parameters; a report folder. An arm that
// fails (out of memory, a plugin error, non-finite losses) is recorded with
// its reason and the others go on.
#include "ab/ab_report.h"
#include "cli/commands.h"
#include "config/config_file.h"
#include "eval/evaluation.h"
#include "log/log.h"
#include "plugin/plugin_identity.h"
#include "plugin/plugin_kind.h"
#include "train/trainer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>

namespace dflash::cli {
namespace fs = std::filesystem;
namespace {

struct ArmSpec {
  std::string name;
  std::string section;  // what the arms differ in: "loss" or "drafter"
  std::string plugin;   // that section's plugin in this arm
  std::vector<std::string> overrides;  // --set assignments of this arm
};

// "NAME" or "NAME:key=value,key=value"; a key without a dot is the arm
// section's. The arm's name is the spec, made safe for a folder name.
ArmSpec parse_arm(const std::string& section, const std::string& spec) {
  ArmSpec arm;
  arm.section = section;
  const size_t colon = spec.find(':');
  arm.plugin = spec.substr(0, colon);
  if (arm.plugin.empty()) throw std::invalid_argument("--" + section + " '" + spec + "': no plugin name before ':'");
  if (colon != std::string::npos) {
    std::stringstream settings(spec.substr(colon + 1));
    for (std::string item; std::getline(settings, item, ',');) {
      if (item.find('=') == std::string::npos)
        throw std::invalid_argument("--" + section + " '" + spec + "': '" + item + "' is not key=value");
      arm.overrides.push_back(item.substr(0, item.find('=')).find('.') == std::string::npos ? section + "." + item : item);
    }
  }
  for (char c : spec) arm.name += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '=' || c == '-') ? c : '-';
  return arm;
}

std::vector<nlohmann::json> read_metrics(const std::string& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

int run_ab(const CliOptions& options) {
  if (!options.config_file) throw std::invalid_argument("ab needs a config: --config FILE.json");
  const bool drafter_arms = options.drafter_arms.size() > 1;
  if (options.loss_arms.size() < 2 && !drafter_arms)
    throw std::invalid_argument("ab compares arms: give --loss at least twice (e.g. --loss ce --loss fused_ckpt_kl), or "
                                "--drafter at least twice (e.g. --drafter dflash --drafter eagle3:token_counts=counts.json)");
  const std::string section = drafter_arms ? "drafter" : "loss";
  std::vector<ArmSpec> arms;
  std::set<std::string> names;
  for (const std::string& spec : drafter_arms ? options.drafter_arms : options.loss_arms) {
    ArmSpec arm = parse_arm(section, spec);
    const std::string base = arm.name;
    for (int copy = 2; names.count(arm.name); ++copy) arm.name = base + "#" + std::to_string(copy);
    names.insert(arm.name);
    arms.push_back(arm);
  }
  const host::PluginRegistry registry = find_plugins(options);
  const train::TrainSettings train = train_settings(options, registry);
  const int64_t base_seed = static_cast<int64_t>(train.seed);
  const std::string out = options.out_dir.value_or(train.output_dir + "/ab");
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_empty(out, ec))
    throw std::invalid_argument(out + " exists and is not empty; an A/B run starts every arm fresh there. Choose another --out "
                                "or move that folder away");
  fs::create_directories(out);

  auto arm_options = [&](const ArmSpec& arm, int64_t seed) {
    CliOptions o = options;
    (arm.section == "drafter" ? o.drafter_arms : o.loss_arms) = {arm.plugin};
    o.plugin_choice[arm.section] = arm.plugin;
    o.stop_after = 0;
    o.overrides.insert(o.overrides.end(), arm.overrides.begin(), arm.overrides.end());
    o.overrides.push_back("train.seed=" + std::to_string(base_seed + seed));
    o.overrides.push_back("train.output_dir=" + nlohmann::json(out + "/" + arm.name + "/seed-" + std::to_string(seed)).dump());
    if (options.steps > 0) o.overrides.push_back("train.steps=" + std::to_string(options.steps));
    return o;
  };

  // Step 0: every arm's gradients on the same first batch from the same
  // initial drafter (the first seed), compared pairwise between arms whose
  // drafters have the same parameters (names and shapes): drafters of
  // different architectures have no gradient in common to compare.
  std::vector<ab::GradientCheck> checks;
  struct ArmGradients {
    std::string arm, parameters;  // parameters: the names and shapes, as text
    at::Tensor flat;
  };
  std::vector<ArmGradients> gradients;
  for (const ArmSpec& arm : arms) {
    try {
      const std::unique_ptr<train::Run> run = make_run(arm_options(arm, 0), registry);
      std::vector<at::Tensor> flat;
      std::string parameters;
      for (const auto& [name, g] : train::first_step_gradients(*run)) {
        flat.push_back(g.detach().to(at::kCPU, at::kDouble).flatten());
        parameters += name + c10::str(g.sizes()) + ";";
      }
      gradients.push_back({arm.name, parameters, at::cat(flat)});
    } catch (const std::exception& e) {
      log::warn("ab: arm " + arm.name + ": no step-0 gradients (" + e.what() + ")");
    }
  }
  constexpr double kEqualTolerance = 1e-4;  // max |g_a − g_b| / max |g_b|
  for (size_t i = 0; i < gradients.size(); ++i)
    for (size_t j = i + 1; j < gradients.size(); ++j) {
      if (gradients[i].parameters != gradients[j].parameters) continue;
      const at::Tensor& a = gradients[i].flat;
      const at::Tensor& b = gradients[j].flat;
      ab::GradientCheck c;
      c.a = gradients[i].arm;
      c.b = gradients[j].arm;
      c.cosine = (a * b).sum().item<double>() / std::max(1e-300, a.norm().item<double>() * b.norm().item<double>());
      c.max_relative_difference = (a - b).abs().max().item<double>() / std::max(1e-300, b.abs().max().item<double>());
      c.equal = c.max_relative_difference <= kEqualTolerance;
      checks.push_back(c);
    }
  gradients.clear();

  // The arms, seed after seed.
  eval::EvalSettings eval_settings;
  eval_settings.prompts_file = options.prompts.value_or(train.eval_prompts);
  eval_settings.max_new_tokens = options.max_new_tokens;
  eval_settings.prompt_tokens = options.prompt_tokens;
  eval_settings.max_prompts = options.max_prompts > 0 ? options.max_prompts : 32;
  eval_settings.baseline = false;
  eval_settings.warmup = false;
  std::vector<ab::ArmRun> runs;
  for (int64_t seed = 0; seed < options.seeds; ++seed)
    for (const ArmSpec& arm : arms) {
      ab::ArmRun run;
      run.arm = arm.name;
      run.seed = base_seed + seed;
      const std::string dir = out + "/" + arm.name + "/seed-" + std::to_string(seed);
      log::info("ab: arm " + arm.name + ", seed " + std::to_string(run.seed));
      try {
        const std::unique_ptr<train::Run> arm_run = make_run(arm_options(arm, seed), registry);
        const int code = train::run_training(*arm_run, train::RunOptions{});
        if (code == kExitStoppedOnRequest) {  // the user or the scheduler ends the comparison, not one arm
          log::warn("ab: stopped by a signal in arm " + arm.name + ", seed " + std::to_string(run.seed) +
                    "; no report written; that arm's checkpoints are in " + dir);
          return kExitStoppedOnRequest;
        }
        if (code != 0) {
          run.failed = true;
          run.failure = code == kExitNonFinite ? "stopped on non-finite losses (exit status 4)"
                                                  : "training ended with exit status " + std::to_string(code);
        } else if (!eval_settings.prompts_file.empty()) {
          const nlohmann::json& target_info = arm_run->target_info();
          arm_run->drafter().set_training(false);
          run.final_eval = eval::evaluate(arm_run->target(), arm_run->drafter(), arm_run->drafter_facts(),
                                          eval::read_prompts(eval_settings, target_info), eval_settings, target_info);
          run.final_eval.erase("per_prompt");
        }
      } catch (const std::exception& e) {
        run.failed = true;
        run.failure = e.what();
        log::warn("ab: arm " + arm.name + " seed " + std::to_string(run.seed) + " failed: " + e.what());
      }
      run.metrics = read_metrics(dir + "/metrics.jsonl");
      runs.push_back(std::move(run));
    }

  std::vector<std::string> arm_names;
  nlohmann::json arm_specs = nlohmann::json::array();
  for (const ArmSpec& arm : arms) {
    arm_names.push_back(arm.name);
    // The library compared, exactly: file, version and hash of its bytes.
    nlohmann::json plugin = nullptr;
    try {
      plugin = host::plugin_identity(registry.find(*host::kind_from_name(arm.section), arm.plugin));
    } catch (const std::exception& e) {
      plugin = {{"error", e.what()}};
    }
    arm_specs.push_back({{"name", arm.name}, {arm.section, arm.plugin}, {"overrides", arm.overrides}, {"plugin", plugin}});
  }
  const nlohmann::json settings = {{"config", *options.config_file}, {"overrides", options.overrides}, {"compared", section},
                                   {"arms", arm_specs},
                                   {"seeds", options.seeds}, {"base_seed", base_seed}, {"steps", options.steps},
                                   {"eval_prompts", eval_settings.prompts_file},
                                   {"gradient_equal_tolerance", kEqualTolerance}};
  const nlohmann::json summary = ab::summarize(arm_names, runs, checks, settings);
  ab::write_report(out, summary, runs);
  std::cout << ab::format_summary(summary) << "\nreport: " << out << "/report.html (results.json, curves.csv beside it)\n";
  // The report is written either way; the status says whether every arm and seed trained.
  bool any_ok = false, any_failed = false;
  for (const auto& a : summary["arms"]) {
    any_ok = any_ok || !a["seeds"].empty();
    any_failed = any_failed || !a["failed"].empty();
  }
  if (!any_ok) return kExitFailure;
  return any_failed ? kExitSomeArmsFailed : kExitOk;
}

}  // namespace dflash::cli
