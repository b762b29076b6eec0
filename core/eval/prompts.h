// Prompt files, as `dflash-host eval` and `dflash-host generate` read them:
// JSON lines, one prompt each —
//   {"prompt_ids": [...]}                    the whole list;
//   {"input_ids": [...], ...}                a training-style line: its first
//                                            prompt_tokens tokens, or (with
//                                            split_at_loss_mask) the tokens
//                                            before its first supervised one;
//   {"text": "..."}                          through the target's tokenizer.
// And the checks both commands run on their paths before any plugin loads.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::eval {

// A prompt and where it came from (for error messages and the report).
struct Prompt {
  std::vector<int64_t> ids;
  int64_t line = 0;
};

struct PromptSettings {
  std::string file;
  int64_t prompt_tokens = 64;  // prefix of "input_ids" lines used as the prompt
  int64_t max_prompts = 0;     // 0: all
  // An "input_ids" line with a "loss_mask" holding a 1 gives the tokens before
  // its first supervised one (the conversation up to the answer, which
  // generate writes anew); other "input_ids" lines their first prompt_tokens.
  // Off (eval): always the first prompt_tokens, so held-out training lines
  // keep their fixed-length prompts.
  bool split_at_loss_mask = false;
};

// Checked before anything is loaded, so that a wrong path fails in a moment
// rather than after the models load (or, for an output, after the whole
// run): the prompts must be a readable regular file (not a folder); an
// output (`flag` names it in the message: --report, --out) an existing
// writable file, or a new one in an existing writable folder. Nothing is
// created or truncated. Throw std::invalid_argument naming the path and the fix.
void check_prompts_file(const std::string& path);
void check_output_file(const std::string& path, const std::string& flag);

// Reads the prompts. Text lines are encoded by the tokenizer the target
// describes ("tokenizer": {"type": "huggingface", "path": ...}, core/text),
// with its special tokens (e.g. BOS); errors name file:line.
std::vector<Prompt> read_prompts(const PromptSettings& settings, const nlohmann::json& target_info);

}  // namespace dflash::eval
