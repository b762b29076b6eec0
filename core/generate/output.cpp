#include "generate/output.h"

#include <cstdio>
#include <sstream>

namespace dflash::generate {

std::string training_line(const eval::Prompt& prompt, const Answer& answer) {
  std::vector<int64_t> ids = prompt.ids;
  ids.insert(ids.end(), answer.tokens.begin(), answer.tokens.end());
  std::vector<int> mask(prompt.ids.size(), 0);
  mask.resize(ids.size(), 1);
  const nlohmann::json line = {{"input_ids", ids},
                               {"loss_mask", mask},
                               {"prompt_tokens", prompt.ids.size()},
                               {"answer_tokens", answer.tokens.size()},
                               {"stop", answer.stop_reason},
                               {"prompt_line", prompt.line}};
  return line.dump();
}

nlohmann::json report_json(const GenerateStats& stats, const GenerateSettings& settings, const std::string& target,
                           const std::string& prompts_file, const std::string& out_file, int64_t answers_under_two) {
  auto per_second = [](double tokens, double seconds) { return seconds > 0 ? tokens / seconds : 0.0; };
  nlohmann::json sampling = {{"temperature", settings.sampling.temperature}};
  if (!settings.sampling.greedy()) {
    sampling["top_p"] = settings.sampling.top_p;
    sampling["seed"] = settings.sampling.seed;
  }
  return {{"target", target},
          {"prompts_file", prompts_file},
          {"out", out_file},
          {"prompts", stats.prompts},
          {"batch_size", settings.batch_size},
          {"max_new_tokens", settings.limits.max_new_tokens},
          {"max_length", settings.limits.max_length},
          {"decoding", settings.sampling.greedy() ? "greedy" : "sampling"},
          {"sampling", sampling},
          {"native_batch_decoding", stats.native_batch},
          {"prompt_tokens", stats.prompt_tokens},
          {"generated_tokens", stats.generated_tokens},
          {"answers_shorter_than_2", answers_under_two},
          {"seconds", stats.seconds},
          {"prefill_seconds", stats.prefill_seconds},
          {"tokens_per_s", per_second(static_cast<double>(stats.generated_tokens), stats.seconds)},
          {"prefill_tokens_per_s", per_second(static_cast<double>(stats.prompt_tokens), stats.prefill_seconds)},
          {"decode_steps", stats.steps},
          {"mean_batch", stats.steps > 0 ? static_cast<double>(stats.step_rows) / static_cast<double>(stats.steps) : 0.0}};
}

std::string format_report(const nlohmann::json& r) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "generated %lld answers (%lld tokens) for %lld prompt tokens in %.2f s: %.1f tokens/s\n",
                r.at("prompts").get<long long>(), r.at("generated_tokens").get<long long>(),
                r.at("prompt_tokens").get<long long>(), r.at("seconds").get<double>(), r.at("tokens_per_s").get<double>());
  out << line;
  std::snprintf(line, sizeof line,
                "  %s, batch size %lld (mean %.1f over %lld decoding steps, %s), prefill %.2f s (%.0f prompt tokens/s)\n",
                r.at("decoding").get<std::string>().c_str(), r.at("batch_size").get<long long>(),
                r.at("mean_batch").get<double>(), r.at("decode_steps").get<long long>(),
                r.at("native_batch_decoding").get<bool>() ? "one target pass per step"
                                                          : "the target lacks decode_extend_batch: one pass per sequence",
                r.at("prefill_seconds").get<double>(), r.at("prefill_tokens_per_s").get<double>());
  out << line;
  out << "  lines: " << r.at("out").get<std::string>() << "\n";
  const int64_t short_answers = r.at("answers_shorter_than_2").get<int64_t>();
  if (short_answers > 0)
    out << "  note: " << short_answers << " answer" << (short_answers == 1 ? " has" : "s have")
        << " fewer than 2 tokens; the jsonl data source skips such lines (a training anchor needs two supervised tokens)\n";
  return out.str();
}

}  // namespace dflash::generate
