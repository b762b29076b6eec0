// The decoding behind `dflash-host generate`: the frozen target answers every
// prompt itself. Up to batch_size sequences decode together, one target pass
// per step for all of them (decode_extend_batch, ABI 1.3; the host loops over
// decode_extend for a target without it). A sequence that stops makes room at
// once for the next prompt (continuous batching), so the batch stays full
// until the prompts run out. Each prompt is prefilled on its own.
#pragma once

#include "eval/prompts.h"
#include "eval/speculative.h"
#include "generate/sampling.h"
#include "plugin/instances.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dflash::generate {

struct GenerateSettings {
  eval::DecodeLimits limits;  // max_new_tokens, max_length (0: none), the end-of-sequence ids
  int64_t batch_size = 1;     // sequences decoded together
  Sampling sampling;          // greedy unless temperature > 0
};

// One prompt's answer: what the target generated after it (an
// end-of-sequence token included), and why it stopped.
struct Answer {
  size_t prompt_index = 0;
  std::vector<int64_t> tokens;
  std::string stop_reason;  // "eos", "max_new_tokens" or "max_length"
};

struct GenerateStats {
  int64_t prompts = 0;
  int64_t prompt_tokens = 0;     // prefilled
  int64_t generated_tokens = 0;  // answer tokens, end-of-sequence tokens included
  int64_t prefills = 0;          // target passes over a prompt
  int64_t steps = 0;             // batched decoding passes
  int64_t step_rows = 0;         // sequences summed over those passes (mean batch = step_rows / steps)
  bool native_batch = false;     // the target has decode_extend_batch (else the host looped over decode_extend)
  double seconds = 0;            // wall clock from the first prefill to the last answer
  double prefill_seconds = 0;    // of which in prefill passes
};

// Generates an answer for every prompt and hands each to on_answer as it
// finishes (not in prompt order). Throws std::invalid_argument naming the
// prompt's file line when a prompt cannot be generated for (empty, or not
// shorter than max_length); every session is ended however it leaves.
GenerateStats generate(const host::TargetModelInstance& target, const std::vector<eval::Prompt>& prompts,
                       const std::string& prompts_file, const GenerateSettings& settings,
                       const std::function<void(Answer&&)>& on_answer);

}  // namespace dflash::generate
