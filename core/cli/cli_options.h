// The command line of dflash-host, parsed with Boost.Program_options.
#pragma once

#include "eval/verification.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dflash::cli {

struct CliOptions {
  std::string command;                     // list, describe, config, plan, train, eval, generate, prepare, ab
  std::vector<std::string> arguments;      // positional arguments after the command
  std::vector<std::string> plugin_dirs;    // --plugin-dir, in order
  bool default_plugin_dirs = true;         // --no-default-plugin-dirs turns off
  bool allow_world_writable_plugins = false;  // --allow-world-writable-plugins: no warning about them
  std::optional<std::string> config_file;  // --config
  std::vector<std::string> overrides;      // --set key.path=value, in order
  std::map<std::string, std::string> plugin_choice;  // section -> name from --loss NAME etc.
  std::optional<std::string> kind;         // --kind (describe)
  std::string log_level = "info";
  bool json = false;                       // --json (list, plan)
  // plan, train: the device's capacity (--gpu-memory), and --skip-memory-check
  std::optional<std::string> device_memory;
  int64_t world_size = 1;  // plan --world-size
  int64_t calibrate = 0;   // plan --calibrate N: batches timed for the throughput forecast
  bool skip_memory_check = false;
  // plan --loss NAME --rows N --vocab V [--hidden H]: the loss alone
  std::optional<int64_t> loss_alone_rows, loss_alone_vocab, loss_alone_hidden;
  int64_t stop_after = 0;                  // --stop-after N (train)
  std::optional<std::string> resume_from;  // --resume-from step-N (train)
  bool allow_config_change = false;        // --allow-config-change (train)
  // eval
  std::optional<std::string> prompts;             // --prompts FILE (JSON lines)
  std::optional<std::string> drafter_checkpoint;  // --drafter-checkpoint DIR
  std::optional<std::string> report;              // --report FILE (JSON)
  int64_t max_new_tokens = 128, max_length = 0, prompt_tokens = 64, max_prompts = 0;
  bool baseline = true;                           // --no-baseline turns off
  bool warmup = true;                             // --no-warmup turns off
  // eval's arms, in order, from --verify chain|tree|chain,tree, --tree-nodes and --tree-temperature
  // N[,N...]: the chain if listed, and one tree per node budget.
  std::vector<eval::Verification> verifications = {eval::Verification{}};
  int64_t draft_tokens = 0;                       // --draft-tokens N: the chain's proposals per step (0: the drafter's)
  // generate (and --prompts, --max-new-tokens, --max-length, --prompt-tokens,
  // --max-prompts, --report, --out)
  int64_t batch_size = 1;                 // --batch-size N: sequences decoded together
  std::optional<double> temperature;      // --temperature T (0: greedy)
  std::optional<double> top_p;            // --top-p P
  std::optional<int64_t> seed;            // --seed S (sampling)
  // prepare (and --out, --config)
  std::optional<std::string> input;        // --input FILE: conversations or texts, JSON lines
  std::optional<std::string> tokenizer;    // --tokenizer PATH: tokenizer.json or a model folder
  std::optional<std::string> chat_format;  // --chat-format NAME (default: from the model folder)
  bool for_generate = false;               // --for-generate: prompts for generate, not training lines
  std::optional<std::string> system;       // --system TEXT: for conversations that have none
  // ab
  std::vector<std::string> loss_arms;             // every --loss, in order (ab: one arm each)
  std::vector<std::string> drafter_arms;          // every --drafter, in order (ab: one arm each)
  int64_t seeds = 1;                              // --seeds N
  int64_t steps = 0;                              // --steps N (0: the config's train.steps)
  std::optional<std::string> out_dir;             // --out DIR (ab), --out FILE (generate)
  bool help = false;
  bool version = false;
};

// eval's token counts (--max-new-tokens, --max-length, --prompt-tokens) and
// --max-prompts go up to this: far beyond any model's context, and small
// enough that prompt + new tokens cannot overflow a position or a size.
inline constexpr int64_t kMaxEvalCount = int64_t{1} << 24;  // 16,777,216
// generate's --batch-size goes up to this; --temperature up to kMaxTemperature.
inline constexpr int64_t kMaxBatchSize = 65536;
inline constexpr double kMaxTemperature = 100;

// Throws std::invalid_argument with a one-line message on bad usage.
CliOptions parse_command_line(int argc, const char* const argv[]);

std::string usage_text();

}  // namespace dflash::cli
