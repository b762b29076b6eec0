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

nlohmann::json evaluate(const host::TargetModelInstance& target, const host::DrafterInstance& drafter,
                        const host::DrafterFacts& facts, const std::vector<Prompt>& prompts, const EvalSettings& s,
                        const nlohmann::json& target_info) {
  if (!target.can_decode())
    throw std::invalid_argument(target.record().label() + " cannot decode incrementally (no decode_* slots); eval needs a target that can");
  if (!drafter.can_draft())
    throw std::invalid_argument(drafter.record().label() + " cannot propose tokens (no draft_* slots); eval needs a drafter that can");
  // A step verifies the newest token and its proposals: the drafter's block,
  // or draft_tokens + 1 where eval sets its own draft length.
  const int64_t block_size = s.draft_tokens > 0 ? s.draft_tokens + 1 : facts.block_size;
  if (block_size < kMinDecodeBlockSize)
    throw std::invalid_argument(drafter.record().label() + ": its block_size is " + std::to_string(block_size) +
                                "; speculative decoding needs blocks of " + std::to_string(kMinDecodeBlockSize) +
                                " tokens or more");
  const std::vector<int64_t>& layer_ids = facts.target_layer_ids;
  DecodeLimits limits;
  limits.max_new_tokens = s.max_new_tokens;
  limits.max_length = s.max_length > 0 ? s.max_length : target_info.value("max_position_embeddings", int64_t{0});
  limits.eos_token_ids = target_info.value("eos_token_ids", std::vector<int64_t>{});

  const Verification& verification = s.verification;
  if (verification.kind == Verification::Kind::kTree && limits.max_length > 0 && verification.tree_nodes + 1 > limits.max_length)
    throw std::invalid_argument("--tree-nodes " + std::to_string(verification.tree_nodes) + ": a tree of that many nodes and the "
                                "newest token is beyond the target's context of " + std::to_string(limits.max_length) +
                                " tokens (max_length, or its max_position_embeddings); verify fewer nodes");

  nlohmann::json per_prompt = nlohmann::json::array();
  std::map<int64_t, int64_t> histogram;  // tokens per verification step → steps
  std::vector<int64_t> offered(static_cast<size_t>(block_size), 0), taken(static_cast<size_t>(block_size), 0);
  int64_t steps = 0, step_tokens = 0, spec_tokens = 0, greedy_tokens = 0;
  double spec_seconds = 0, greedy_seconds = 0;
  if (s.warmup && !prompts.empty()) {  // untimed, unreported: decoding is deterministic, so it changes no result
    try {
      speculative_decode(target, drafter, prompts.front().ids, limits, block_size, layer_ids, nullptr, verification);
      if (s.baseline) greedy_decode(target, prompts.front().ids, limits);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where(s.prompts_file, prompts.front().line) + ": " + e.what());
    }
  }
  for (const Prompt& p : prompts) {
    const std::string at = where(s.prompts_file, p.line);
    Generation spec;
    try {
      spec = speculative_decode(target, drafter, p.ids, limits, block_size, layer_ids, nullptr, verification);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(at + ": " + e.what());
    }
    nlohmann::json row = {{"line", p.line},
                          {"prompt_tokens", p.ids.size()},
                          {"generated", spec.tokens.size()},
                          {"stop_reason", spec.stop_reason},
                          {"target_passes", spec.target_passes},
                          {"seconds", spec.seconds}};
    int64_t prompt_step_tokens = 0;
    for (size_t i = 0; i < spec.step_tokens.size(); ++i) {
      ++histogram[spec.step_tokens[i]];
      prompt_step_tokens += spec.step_tokens[i];
      for (int64_t k = 0; k < spec.step_proposed[i]; ++k) {
        ++offered[static_cast<size_t>(k + 1)];
        if (k < spec.step_accepted[i]) ++taken[static_cast<size_t>(k + 1)];
      }
    }
    steps += static_cast<int64_t>(spec.step_tokens.size());
    step_tokens += prompt_step_tokens;
    row["tau"] = spec.step_tokens.empty() ? 0.0 : double(prompt_step_tokens) / double(spec.step_tokens.size());
    spec_tokens += static_cast<int64_t>(spec.tokens.size());
    spec_seconds += spec.seconds;
    if (s.baseline) {
      const Generation greedy = greedy_decode(target, p.ids, limits);
      const bool same = greedy.tokens == spec.tokens;
      row["identical_to_greedy"] = same;
      row["greedy_seconds"] = greedy.seconds;
      greedy_tokens += static_cast<int64_t>(greedy.tokens.size());
      greedy_seconds += greedy.seconds;
      if (!same) {
        row["greedy_tokens"] = greedy.tokens;
        // A near-tie or a wrong token: one extra target pass, after both
        // decodings' clocks stopped, so no timed figure includes it.
        try {
          row["divergence"] = find_divergence(target, p.ids, spec.tokens, greedy.tokens)->to_json();
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(at + ": measuring where the outputs diverge: " + e.what());
        }
      }
    }
    row["tokens"] = spec.tokens;
    per_prompt.push_back(row);
  }
  nlohmann::json by_position = nlohmann::json::array();
  for (int64_t k = 1; k < block_size; ++k)
    by_position.push_back(offered[k] > 0 ? nlohmann::json(double(taken[k]) / double(offered[k])) : nlohmann::json(nullptr));
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [tokens, count] : histogram) hist[std::to_string(tokens)] = count;
  nlohmann::json report = {
      {"target", target.record().name},
      {"drafter", drafter.record().name},
      {"drafter_checkpoint", s.drafter_checkpoint},
      {"block_size", block_size},
      {"draft_tokens", block_size - 1},
      {"prompts", prompts.size()},
      {"max_new_tokens", limits.max_new_tokens},
      {"max_length", limits.max_length},
      {"warmup_prompts", s.warmup && !prompts.empty() ? 1 : 0},
      {"verify", verification.kind == Verification::Kind::kTree ? "tree" : "chain"},
      {"tree_nodes", verification.kind == Verification::Kind::kTree ? verification.tree_nodes : 0},
      {"verification_steps", steps},
      {"tau_mean", steps > 0 ? double(step_tokens) / double(steps) : 0.0},
      {"tau_histogram", hist},
      {"acceptance_by_position", by_position},
      {"speculative_tokens_per_s", spec_seconds > 0 ? double(spec_tokens) / spec_seconds : 0.0},
      {"per_prompt", per_prompt}};
  if (s.baseline) {
    report["greedy_tokens_per_s"] = greedy_seconds > 0 ? double(greedy_tokens) / greedy_seconds : 0.0;
    report["speedup"] = spec_seconds > 0 && greedy_seconds > 0
                            ? (double(spec_tokens) / spec_seconds) / (double(greedy_tokens) / greedy_seconds)
                            : 0.0;
    report.update(lossless_summary(report.at("per_prompt")));
  }
  return report;
}

std::string format_report(const nlohmann::json& r) {
  std::ostringstream out;
  out << std::fixed;
  out << "speculative decoding: target " << r.at("target").get<std::string>() << ", drafter "
      << r.at("drafter").get<std::string>();
  const std::string checkpoint = r.value("drafter_checkpoint", std::string());
  if (!checkpoint.empty()) out << " (" << checkpoint << ")";
  out << ", block size " << r.at("block_size");
  if (r.value("verify", std::string("chain")) == "tree") out << ", draft trees of " << r.at("tree_nodes") << " nodes";
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

}  // namespace dflash::eval
