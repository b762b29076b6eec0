#include "eval/evaluation.h"

#include "checkpoint/checkpoint.h"
#include "eval/divergence.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

namespace dflash::eval {
namespace fs = std::filesystem;
namespace {

std::string where(const std::string& file, int64_t line) { return file + ":" + std::to_string(line); }

}  // namespace

void load_drafter_checkpoint(const std::string& path, const host::DrafterInstance& drafter, const nlohmann::json& target_info) {
  checkpoint::DrafterDirectory saved;
  try {
    saved = checkpoint::load_drafter(path);
  } catch (const std::runtime_error& e) {  // a bad path or file is bad input here
    throw std::invalid_argument(e.what());
  }
  const std::string config_file = saved.dir + "/config.json";
  const nlohmann::json own = drafter.export_config().value_or(nlohmann::json::object());
  auto mismatch = [&](const char* key, const nlohmann::json& theirs, const nlohmann::json& ours, const std::string& whose) {
    return std::invalid_argument(config_file + ": " + key + " is " + theirs.dump() + " but " + whose + " has " + ours.dump() +
                                 "; evaluate the drafter with the target and drafter settings it was trained with");
  };
  // What must agree: the host's two facts, and what the drafter names
  // (ABI 1.5's checkpoint_match) of its own config and of the target's.
  std::vector<std::string> drafter_keys = {"block_size", "target_layer_ids"};
  std::vector<std::pair<std::string, std::string>> target_keys;
  if (const std::optional<nlohmann::json> match = drafter.checkpoint_match()) {
    for (const auto& key : match->value("drafter", nlohmann::json::array()))
      if (std::find(drafter_keys.begin(), drafter_keys.end(), key.get<std::string>()) == drafter_keys.end())
        drafter_keys.push_back(key.get<std::string>());
    const nlohmann::json of_target = match->value("target", nlohmann::json::object());  // items() must not outlive it
    for (const auto& [key, fact] : of_target.items()) target_keys.emplace_back(key, fact.get<std::string>());
  }
  for (const auto& [key, fact] : target_keys)
    if (saved.config.contains(key) && target_info.contains(fact) && saved.config[key] != target_info[fact])
      throw mismatch(key.c_str(), saved.config[key], target_info[fact], "the target");
  for (const std::string& key : drafter_keys)
    if (saved.config.contains(key) && own.contains(key) && saved.config[key] != own[key])
      throw mismatch(key.c_str(), saved.config[key], own[key], "the configured drafter (set it in the config's drafter section)");
  if (saved.config.contains("target_layer_ids") && target_info.contains("num_layers"))
    for (const auto& id : saved.config["target_layer_ids"])
      if (id.get<int64_t>() >= target_info["num_layers"].get<int64_t>())
        throw std::invalid_argument(config_file + ": target_layer_ids holds " + id.dump() + ", but the target has only " +
                                    target_info["num_layers"].dump() + " layers");
  const std::map<std::string, at::Tensor> weights(saved.weights.begin(), saved.weights.end());
  // Parameters load into the dtype evaluated in (a bf16 run's weights upcast
  // exactly to fp32); a buffer's values (a vocabulary map, say) must not be
  // converted. Everything is checked before anything is copied.
  const host::NamedTensors parameters = drafter.parameters(), buffers = drafter.buffers();
  for (const auto& [tensors, exact_dtype] : {std::pair{&parameters, false}, std::pair{&buffers, true}})
    if (const std::optional<checkpoint::TensorMismatch> bad = checkpoint::first_mismatch(weights, *tensors, exact_dtype)) {
      const std::string file = saved.dir + "/model.safetensors: ";
      switch (bad->kind) {
        case checkpoint::TensorMismatch::Kind::kMissing:
          throw std::invalid_argument(file + "tensor '" + bad->name + "' is missing for this drafter");
        case checkpoint::TensorMismatch::Kind::kShape:
          throw std::invalid_argument(file + "tensor '" + bad->name + "' has shape " + c10::str(bad->saved.sizes()) +
                                      ", the drafter's is " + c10::str(bad->wanted.sizes()));
        case checkpoint::TensorMismatch::Kind::kDtype:
          throw std::invalid_argument(file + "buffer '" + bad->name + "' holds " +
                                      std::string(c10::toString(bad->saved.scalar_type())) + " values, the drafter's is " +
                                      c10::toString(bad->wanted.scalar_type()));
      }
    }
  checkpoint::copy_saved(weights, parameters);
  checkpoint::copy_saved(weights, buffers);
}

namespace {

// An arm as it runs: how it verifies, and the block a step verifies (the
// newest token and the proposals, or the tree's depth bound).
struct Arm {
  Verification verification;
  int64_t block_size = 0;
};

DecodeLimits limits_of(const EvalSettings& s, const nlohmann::json& target_info) {
  DecodeLimits limits;
  limits.max_new_tokens = s.max_new_tokens;
  limits.max_length = s.max_length > 0 ? s.max_length : target_info.value("max_position_embeddings", int64_t{0});
  limits.eos_token_ids = target_info.value("eos_token_ids", std::vector<int64_t>{});
  return limits;
}

// Checked for every arm before anything is decoded: a bad last arm must not
// cost the others' decoding first.
Arm plan_arm(const host::DrafterInstance& drafter, const host::DrafterFacts& facts, const EvalSettings& s,
             const Verification& verification, const DecodeLimits& limits) {
  const bool tree = verification.kind == Verification::Kind::kTree;
  // A step verifies the newest token and its proposals: the drafter's block,
  // or draft_tokens + 1 where eval sets a chain's own length.
  const int64_t block_size = !tree && s.draft_tokens > 0 ? s.draft_tokens + 1 : facts.block_size;
  if (block_size < kMinDecodeBlockSize)
    throw std::invalid_argument(drafter.record().label() + ": its block_size is " + std::to_string(block_size) +
                                "; speculative decoding needs blocks of " + std::to_string(kMinDecodeBlockSize) +
                                " tokens or more");
  if (tree && limits.max_length > 0 && verification.tree_nodes + 1 > limits.max_length)
    throw std::invalid_argument("--tree-nodes " + std::to_string(verification.tree_nodes) + ": a tree of that many nodes and the "
                                "newest token is beyond the target's context of " + std::to_string(limits.max_length) +
                                " tokens (max_length, or its max_position_embeddings); verify fewer nodes");
  return {verification, block_size};
}

// One arm's figures, prompt by prompt.
struct ArmTally {
  explicit ArmTally(const Arm& arm)
      : arm(arm), offered(static_cast<size_t>(arm.block_size), 0), taken(static_cast<size_t>(arm.block_size), 0) {}
  Arm arm;
  nlohmann::json per_prompt = nlohmann::json::array();
  std::map<int64_t, int64_t> histogram;  // tokens per verification step → steps
  std::vector<int64_t> offered, taken;   // by block position: proposals offered, accepted
  int64_t steps = 0, step_tokens = 0, tokens = 0;
  double seconds = 0;
};

// The target alone's figures, shared by every arm.
struct GreedyTally {
  int64_t tokens = 0;
  double seconds = 0;
};

// Runs one decoding of the prompt at `at` (file:line), its bad input named there.
template <typename Decode>
Generation decode_at(const std::string& at, const Decode& decode) {
  try {
    return decode();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(at + ": " + e.what());
  }
}

Generation speculative_arm(const host::TargetModelInstance& target, const host::DrafterInstance& drafter, const Prompt& p,
                           const DecodeLimits& limits, const Arm& arm, const std::vector<int64_t>& layer_ids) {
  return speculative_decode(target, drafter, p.ids, limits, arm.block_size, layer_ids, nullptr, arm.verification);
}

// Adds one prompt's speculative decoding to its arm; returns the prompt's
// row, still without the comparison with the target alone.
nlohmann::json tally_prompt(ArmTally& tally, const Prompt& p, const Generation& spec) {
  nlohmann::json row = {{"line", p.line},
                        {"prompt_tokens", p.ids.size()},
                        {"generated", spec.tokens.size()},
                        {"stop_reason", spec.stop_reason},
                        {"target_passes", spec.target_passes},
                        {"seconds", spec.seconds},
                        {"tokens", spec.tokens}};
  int64_t prompt_step_tokens = 0;
  for (size_t i = 0; i < spec.step_tokens.size(); ++i) {
    ++tally.histogram[spec.step_tokens[i]];
    prompt_step_tokens += spec.step_tokens[i];
    for (int64_t k = 0; k < spec.step_proposed[i]; ++k) {
      ++tally.offered[static_cast<size_t>(k + 1)];
      if (k < spec.step_accepted[i]) ++tally.taken[static_cast<size_t>(k + 1)];
    }
  }
  tally.steps += static_cast<int64_t>(spec.step_tokens.size());
  tally.step_tokens += prompt_step_tokens;
  row["tau"] = spec.step_tokens.empty() ? 0.0 : double(prompt_step_tokens) / double(spec.step_tokens.size());
  tally.tokens += static_cast<int64_t>(spec.tokens.size());
  tally.seconds += spec.seconds;
  return row;
}

// The row's lossless check against the target's own decoding; where the
// outputs differ, where and how (a near-tie or a wrong token): one extra
// target pass, after every decoding's clock stopped, so no timed figure
// includes it.
void compare_with_greedy(nlohmann::json& row, const host::TargetModelInstance& target, const Prompt& p,
                         const Generation& spec, const Generation& greedy, const std::string& at) {
  const bool same = greedy.tokens == spec.tokens;
  row["identical_to_greedy"] = same;
  row["greedy_seconds"] = greedy.seconds;
  if (same) return;
  row["greedy_tokens"] = greedy.tokens;
  try {
    row["divergence"] = find_divergence(target, p.ids, spec.tokens, greedy.tokens)->to_json();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(at + ": measuring where the outputs diverge: " + e.what());
  }
}

double per_second(int64_t tokens, double seconds) { return seconds > 0 ? double(tokens) / seconds : 0.0; }

nlohmann::json report_of(const ArmTally& tally, const GreedyTally* greedy, const host::TargetModelInstance& target,
                         const host::DrafterInstance& drafter, size_t prompts, const DecodeLimits& limits,
                         const EvalSettings& s) {
  const int64_t block_size = tally.arm.block_size;
  const Verification& verification = tally.arm.verification;
  nlohmann::json by_position = nlohmann::json::array();
  for (size_t k = 1; k < static_cast<size_t>(block_size); ++k)
    by_position.push_back(tally.offered[k] > 0 ? nlohmann::json(double(tally.taken[k]) / double(tally.offered[k]))
                                               : nlohmann::json(nullptr));
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [tokens, count] : tally.histogram) hist[std::to_string(tokens)] = count;
  nlohmann::json report = {
      {"target", target.record().name},
      {"drafter", drafter.record().name},
      {"drafter_checkpoint", s.drafter_checkpoint},
      {"block_size", block_size},
      {"draft_tokens", block_size - 1},
      {"prompts", prompts},
      {"max_new_tokens", limits.max_new_tokens},
      {"max_length", limits.max_length},
      {"warmup_prompts", s.warmup && prompts > 0 ? 1 : 0},
      {"verify", verification.kind == Verification::Kind::kTree ? "tree" : "chain"},
      {"tree_nodes", verification.kind == Verification::Kind::kTree ? verification.tree_nodes : 0},
      {"tree_temperature", verification.kind == Verification::Kind::kTree ? verification.tree_temperature : 1.0},
      {"verification_steps", tally.steps},
      {"tau_mean", tally.steps > 0 ? double(tally.step_tokens) / double(tally.steps) : 0.0},
      {"tau_histogram", hist},
      {"acceptance_by_position", by_position},
      {"speculative_tokens_per_s", per_second(tally.tokens, tally.seconds)},
      {"per_prompt", tally.per_prompt}};
  if (greedy != nullptr) {
    report["greedy_tokens_per_s"] = per_second(greedy->tokens, greedy->seconds);
    report["speedup"] = tally.seconds > 0 && greedy->seconds > 0
                            ? per_second(tally.tokens, tally.seconds) / per_second(greedy->tokens, greedy->seconds)
                            : 0.0;
    report.update(lossless_summary(report.at("per_prompt")));
  }
  return report;
}

}  // namespace

std::vector<nlohmann::json> evaluate_arms(const host::TargetModelInstance& target, const host::DrafterInstance& drafter,
                                          const host::DrafterFacts& facts, const std::vector<Prompt>& prompts,
                                          const EvalSettings& s, const std::vector<Verification>& verifications,
                                          const nlohmann::json& target_info) {
  if (!target.can_decode())
    throw std::invalid_argument(target.record().label() + " cannot decode incrementally (no decode_* slots); eval needs a target that can");
  if (!drafter.can_draft())
    throw std::invalid_argument(drafter.record().label() + " cannot propose tokens (no draft_* slots); eval needs a drafter that can");
  if (verifications.empty()) throw std::invalid_argument("eval needs at least one way of verifying (--verify)");
  const std::vector<int64_t>& layer_ids = facts.target_layer_ids;
  const DecodeLimits limits = limits_of(s, target_info);
  std::vector<Arm> arms;
  for (const Verification& verification : verifications) arms.push_back(plan_arm(drafter, facts, s, verification, limits));

  if (s.warmup && !prompts.empty()) {  // untimed, unreported: decoding is deterministic, so it changes no result
    const Prompt& first = prompts.front();
    const std::string at = where(s.prompts_file, first.line);
    for (const Arm& arm : arms) decode_at(at, [&] { return speculative_arm(target, drafter, first, limits, arm, layer_ids); });
    if (s.baseline) decode_at(at, [&] { return greedy_decode(target, first.ids, limits); });
  }
  std::vector<ArmTally> tallies(arms.begin(), arms.end());
  GreedyTally greedy_tally;
  std::vector<Generation> specs(arms.size());
  for (const Prompt& p : prompts) {
    const std::string at = where(s.prompts_file, p.line);
    for (size_t a = 0; a < arms.size(); ++a)
      specs[a] = decode_at(at, [&] { return speculative_arm(target, drafter, p, limits, arms[a], layer_ids); });
    // The one decoding by the target alone: every arm's reference.
    const std::optional<Generation> greedy = s.baseline ? std::optional<Generation>(greedy_decode(target, p.ids, limits)) : std::nullopt;
    if (greedy) {
      greedy_tally.tokens += static_cast<int64_t>(greedy->tokens.size());
      greedy_tally.seconds += greedy->seconds;
    }
    for (size_t a = 0; a < arms.size(); ++a) {
      nlohmann::json row = tally_prompt(tallies[a], p, specs[a]);
      if (greedy) compare_with_greedy(row, target, p, specs[a], *greedy, at);
      tallies[a].per_prompt.push_back(std::move(row));
    }
  }
  std::vector<nlohmann::json> reports;
  for (const ArmTally& tally : tallies)
    reports.push_back(report_of(tally, s.baseline ? &greedy_tally : nullptr, target, drafter, prompts.size(), limits, s));
  return reports;
}

nlohmann::json evaluate(const host::TargetModelInstance& target, const host::DrafterInstance& drafter,
                        const host::DrafterFacts& facts, const std::vector<Prompt>& prompts, const EvalSettings& s,
                        const nlohmann::json& target_info) {
  return evaluate_arms(target, drafter, facts, prompts, s, {s.verification}, target_info).front();
}

std::string format_report(const nlohmann::json& r) {
  std::ostringstream out;
  out << std::fixed;
  out << "speculative decoding: target " << r.at("target").get<std::string>() << ", drafter "
      << r.at("drafter").get<std::string>();
  const std::string checkpoint = r.value("drafter_checkpoint", std::string());
  if (!checkpoint.empty()) out << " (" << checkpoint << ")";
  out << ", block size " << r.at("block_size");
  if (r.value("verify", std::string("chain")) == "tree") {
    out << ", draft trees of " << r.at("tree_nodes") << " nodes";
    const double temperature = r.value("tree_temperature", 1.0);
    if (temperature != 1.0) out << " at temperature " << temperature_text(temperature);
  }
  out << ", " << r.at("prompts") << " prompts, up to "
      << r.at("max_new_tokens") << " new tokens each\n\n";
  out << "  mean acceptance length τ   " << std::setprecision(3) << r.at("tau_mean").get<double>()
      << "  (tokens per target pass, over " << r.at("verification_steps") << " verification steps)\n";
  out << "  τ histogram                ";
  for (const auto& [tokens, count] : r.at("tau_histogram").items()) out << tokens << ":" << count << " ";
  out << "\n  acceptance by position     ";
  for (const auto& a : r.at("acceptance_by_position"))
    out << (a.is_null() ? std::string("  -  ") : [&] { std::ostringstream o; o << std::fixed << std::setprecision(2) << a.get<double>(); return o.str(); }()) << " ";
  out << "\n  speculative tokens/s       " << std::setprecision(1) << r.at("speculative_tokens_per_s").get<double>() << "\n";
  if (r.contains("greedy_tokens_per_s")) {
    out << "  target-only tokens/s       " << r.at("greedy_tokens_per_s").get<double>() << "\n";
    out << "  speed-up                   " << std::setprecision(2) << r.at("speedup").get<double>() << "×\n";
    out << "  lossless                   " << lossless_line(r) << "\n";
  }
  out << "\n  line  prompt  generated  passes     τ  stop\n";
  for (const auto& row : r.at("per_prompt")) {
    char buffer[160];
    std::snprintf(buffer, sizeof buffer, "  %4lld  %6lld  %9lld  %6lld  %5.2f  %s", row.at("line").get<long long>(),
                  row.at("prompt_tokens").get<long long>(), row.at("generated").get<long long>(),
                  row.at("target_passes").get<long long>(), row.at("tau").get<double>(),
                  row.at("stop_reason").get<std::string>().c_str());
    out << buffer;
    if (!row.value("identical_to_greedy", true))
      out << "  (differs from greedy" << (row.contains("divergence") ? " " + divergence_line(row.at("divergence")) : "!") << ")";
    out << "\n";
  }
  return out.str();
}

Verification verification_of(const nlohmann::json& report) {
  if (report.value("verify", std::string("chain")) == "tree")
    return {Verification::Kind::kTree, report.at("tree_nodes").get<int64_t>(), report.value("tree_temperature", 1.0)};
  return {};
}

nlohmann::json compare_arms(const std::vector<nlohmann::json>& reports) {
  nlohmann::json comparison = nlohmann::json::array();
  if (reports.empty()) return comparison;
  const double first_tau = reports.front().at("tau_mean").get<double>();
  const double first_speed = reports.front().at("speculative_tokens_per_s").get<double>();
  auto ratio = [](double value, double first) { return first > 0 ? nlohmann::json(value / first) : nlohmann::json(nullptr); };
  for (const nlohmann::json& report : reports) {
    const Verification verification = verification_of(report);
    const double tau = report.at("tau_mean").get<double>();
    const double speed = report.at("speculative_tokens_per_s").get<double>();
    nlohmann::json entry = {{"arm", arm_label(verification)},
                            {"verify", report.at("verify")},
                            {"tree_nodes", report.at("tree_nodes")},
                            {"tree_temperature", verification.tree_temperature},
                            {"tau_mean", tau},
                            {"tau_ratio_to_first", ratio(tau, first_tau)},
                            {"speculative_tokens_per_s", speed},
                            {"speed_ratio_to_first", ratio(speed, first_speed)}};
    if (report.contains("speedup")) entry["speedup"] = report.at("speedup");
    if (report.contains("lossless")) entry["lossless"] = report.at("lossless");
    comparison.push_back(entry);
  }
  return comparison;
}

std::string format_comparison(const nlohmann::json& comparison) {
  if (comparison.empty()) return "";
  auto cell = [](const nlohmann::json& value, const char* format) {
    if (value.is_null()) return std::string("-");
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, format, value.get<double>());
    return std::string(buffer);
  };
  const bool baseline = comparison.front().contains("speedup");
  std::ostringstream out;
  out << "arms compared (ratios to the first arm, " << comparison.front().at("arm").get<std::string>() << "):\n\n";
  // The arm column as wide as its longest name ("tree 128 T=0.7"), 10 at least.
  size_t width = 10;
  for (const nlohmann::json& entry : comparison) width = std::max(width, entry.at("arm").get<std::string>().size());
  // Spelled out: τ is one column but two bytes, which printf's widths count.
  out << "  arm" << std::string(width + 4, ' ') << "τ  τ / first      tokens/s  speed / first"
      << (baseline ? "  speed-up  lossless" : "") << "\n";
  char line[200];
  for (const nlohmann::json& entry : comparison) {
    std::snprintf(line, sizeof line, "  %-*s  %6s  %9s  %12s  %13s", static_cast<int>(width), entry.at("arm").get<std::string>().c_str(),
                  cell(entry.at("tau_mean"), "%.3f").c_str(), cell(entry.at("tau_ratio_to_first"), "%.2f").c_str(),
                  cell(entry.at("speculative_tokens_per_s"), "%.1f").c_str(),
                  cell(entry.at("speed_ratio_to_first"), "%.2f").c_str());
    out << line;
    if (entry.contains("speedup"))
      out << "  " << std::setw(7) << cell(entry.at("speedup"), "%.2f") << "×  "
          << (entry.at("lossless").get<bool>() ? "yes" : "no");
    out << "\n";
  }
  return out.str();
}

}  // namespace dflash::eval
