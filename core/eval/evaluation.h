// `dflash-host eval`: speculative decoding with a trained (or training-free)
// drafter on held-out prompts, checked token for token against the target's
// own greedy decoding, with the acceptance figures researchers compare.
#pragma once

#include "eval/prompts.h"
#include "eval/speculative.h"
#include "plugin/drafter_facts.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::eval {

struct EvalSettings {
  std::string prompts_file;        // JSON lines: "prompt_ids", "input_ids" (first prompt_tokens), or "text"
  std::string drafter_checkpoint;  // empty: the drafter as configured (untrained, or training-free)
  int64_t max_new_tokens = 128;
  int64_t max_length = 0;          // 0: the target's max_position_embeddings, else unbounded
  int64_t prompt_tokens = 64;      // prefix of "input_ids" lines used as the prompt
  int64_t max_prompts = 0;         // 0: all
  bool baseline = true;            // also decode with the target alone (the lossless check and the speed-up)
  // The first prompt decoded once, both ways, before any clock runs: the
  // one-time costs (lazy initialisation, library handles, CUDA graph
  // captures) are then not charged to the first prompt's tokens/s. Off where
  // only τ matters (training's periodic eval, ab).
  bool warmup = true;
  // evaluate()'s one arm: chain (default) or a draft tree of
  // verification.tree_nodes nodes. evaluate_arms takes its arms instead.
  Verification verification;
  // Chain decoding: tokens the drafter is asked for a step. 0: its
  // block_size − 1 (a DFlash drafter's block; an autoregressive drafter's,
  // e.g. EAGLE-3's, trained depth). A drafter may propose fewer (the ABI's
  // 0 ≤ m ≤ count: a DFlash drafter never more than its block − 1). Chain
  // arms only: a tree's depth is bounded by the drafter's own block, so a
  // chain of a set length and trees can be compared in one run.
  int64_t draft_tokens = 0;
};

// The report's path, checked before anything is loaded (prompts.h).
inline void check_report_file(const std::string& path) { check_output_file(path, "--report"); }

// The prompts (prompts.h): "input_ids" lines give their first prompt_tokens.
inline std::vector<Prompt> read_prompts(const EvalSettings& settings, const nlohmann::json& target_info) {
  return read_prompts(PromptSettings{settings.prompts_file, settings.prompt_tokens, settings.max_prompts, false}, target_info);
}

// Loads the drafter checkpoint into the drafter's parameters after checking
// it against the target and the drafter (vocab, hidden size, block size,
// target layers); errors name the file, the field and both values.
void load_drafter_checkpoint(const std::string& path, const host::DrafterInstance& drafter, const nlohmann::json& target_info);

// Decodes every prompt (speculatively, and with the target alone unless
// settings.baseline is off) and returns the report: τ mean and histogram,
// acceptance by block position, tokens/s of both, per-prompt results, and
// whether every output matched the target's greedy one. Where one differs,
// its row gets the first divergence, measured by one extra (untimed) target
// pass and classified near-tie or other (divergence.h), and the report the
// lossless summary (lossless_summary).
// `facts`: the drafter's (plugin/drafter_facts.h), read after bind_target.
nlohmann::json evaluate(const host::TargetModelInstance& target, const host::DrafterInstance& drafter,
                        const host::DrafterFacts& facts, const std::vector<Prompt>& prompts, const EvalSettings& settings,
                        const nlohmann::json& target_info);

// The same for several ways of verifying (a DDTree budget sweep beside the
// chain) in one run: every prompt is decoded once per arm, arms in order, and
// once by the target alone (settings.baseline), that one greedy decoding
// being every arm's lossless reference and its speed-up's denominator. The
// warm-up decodes the first prompt once per arm and once alone. One report
// per arm, in `arms`' order, each as evaluate() gives it; every arm is
// checked (a tree's budget against the context) before anything is decoded.
// settings.verification is not read.
std::vector<nlohmann::json> evaluate_arms(const host::TargetModelInstance& target, const host::DrafterInstance& drafter,
                                          const host::DrafterFacts& facts, const std::vector<Prompt>& prompts,
                                          const EvalSettings& settings, const std::vector<Verification>& arms,
                                          const nlohmann::json& target_info);

// The report as a console table.
std::string format_report(const nlohmann::json& report);

// The arm a report ran ("verify", "tree_nodes", "tree_temperature": 1 where absent).
Verification verification_of(const nlohmann::json& report);

// evaluate_arms' reports side by side, one entry per arm: "arm" (arm_label),
// "verify", "tree_nodes", "tree_temperature", "tau_mean", "speculative_tokens_per_s", their
// ratios to the first arm's ("tau_ratio_to_first", "speed_ratio_to_first";
// null where the first's is 0), and where a baseline ran "speedup" and
// "lossless".
nlohmann::json compare_arms(const std::vector<nlohmann::json>& reports);

// That comparison as a console table, one line per arm.
std::string format_comparison(const nlohmann::json& comparison);

}  // namespace dflash::eval
