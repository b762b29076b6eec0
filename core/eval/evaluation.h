// `dflash-host eval`: speculative decoding with a trained (or training-free)
// drafter on held-out prompts, checked token for token against the target's
// own greedy decoding, with the acceptance figures researchers compare.
#pragma once

#include "eval/speculative.h"

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
};

// A prompt and where it came from (for error messages and the report).
struct Prompt {
  std::vector<int64_t> ids;
  int64_t line = 0;
};

// Checked before anything is loaded, so that a wrong path fails in a moment
// rather than after the models load (or, for the report, after the whole
// evaluation): the prompts must be a readable regular file (not a folder);
// the report an existing writable file, or a new one in an existing writable
// folder. Throw std::invalid_argument naming the path and the fix.
void check_prompts_file(const std::string& path);
void check_report_file(const std::string& path);

// Reads the prompts. Text lines need a tokenizer the target describes
// ("tokenizer": {"type": "bytes", ...}); errors name file:line.
std::vector<Prompt> read_prompts(const EvalSettings& settings, const nlohmann::json& target_info);

// Loads the drafter checkpoint into the drafter's parameters after checking
// it against the target and the drafter (vocab, hidden size, block size,
// target layers); errors name the file, the field and both values.
void load_drafter_checkpoint(const std::string& path, const host::DrafterInstance& drafter, const nlohmann::json& target_info);

// Decodes every prompt (speculatively, and with the target alone unless
// settings.baseline is off) and returns the report: τ mean and histogram,
// acceptance by block position, tokens/s of both, per-prompt results, and
// whether every output matched the target's greedy one.
nlohmann::json evaluate(const host::TargetModelInstance& target, const host::DrafterInstance& drafter,
                        const std::vector<Prompt>& prompts, const EvalSettings& settings, const nlohmann::json& target_info);

// The report as a console table.
std::string format_report(const nlohmann::json& report);

}  // namespace dflash::eval
