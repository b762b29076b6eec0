// What `dflash-host generate` writes: one training line per prompt, in the
// format the jsonl data source reads, and the run's report (console and JSON).
#pragma once

#include "eval/prompts.h"
#include "generate/generation.h"

#include <nlohmann/json.hpp>

#include <string>

namespace dflash::generate {

// {"input_ids": prompt + answer, "loss_mask": 0 per prompt token, 1 per answer
// token, "prompt_tokens", "answer_tokens", "stop", "prompt_line"}: the jsonl
// data source reads the first two and ignores the rest.
std::string training_line(const eval::Prompt& prompt, const Answer& answer);

// The run's figures: tokens/s (generated tokens over wall clock, prefill
// included), the settings, and where the lines went.
nlohmann::json report_json(const GenerateStats& stats, const GenerateSettings& settings, const std::string& target,
                           const std::string& prompts_file, const std::string& out_file, int64_t answers_under_two);

// The report for the console.
std::string format_report(const nlohmann::json& report);

}  // namespace dflash::generate
