#include "pipeline/calibration.h"

#include "train/adamw.h"
#include "train/phase_timer.h"
#include "train/stages.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace dflash::pipeline {
namespace {

double seconds_of(const nlohmann::json& phases, std::initializer_list<const char*> names) {
  double total = 0;
  for (const char* name : names)
    if (phases.contains(name)) total += phases.at(name).get<double>();
  return total;
}

std::string rate(double tokens_per_s) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(0) << tokens_per_s << " tokens/s";
  return out.str();
}

}  // namespace

Calibration calibrate(train::Run& run, int batches) {
  run.bind();
  const train::TrainSettings& s = run.settings();
  const c10::Device device(s.device);
  Calibration c;
  c.device = device.str();
  c.batches = batches;
  train::AdamWOptions adam;
  adam.fp32_master = s.fp32_master();
  train::AdamW optimizer(run.drafter().parameters(), adam);
  train::PhaseTimer timer(/*enabled=*/true, device);
  double tokens = 0;
  for (int i = 0; i <= batches; ++i) {
    std::optional<host::NamedTensors> batch = run.data().next_batch();
    if (!batch)
      throw std::runtime_error(run.data().record().label() + " ended after " + std::to_string(i) + " batches; --calibrate " +
                               std::to_string(batches) + " needs " + std::to_string(batches + 1));
    train::MicroBatch mb;
    mb.batch = std::move(*batch);
    const double batch_tokens = static_cast<double>(host::require_tensor(mb.batch, "input_ids", "the data source").numel());
    std::string phase;
    timer.start();
    train::produce(run, mb, phase, timer);
    train::draft_and_score(run, mb, 0, i, phase, timer);
    mb.out.loss.backward();
    timer.end("backward");
    const nlohmann::json phases = timer.take();
    mb = train::MicroBatch{};
    timer.start();
    optimizer.step(s.lr);
    optimizer.zero_grad();
    timer.end("optimizer");
    const nlohmann::json step = timer.take();
    if (i == 0) continue;  // the warm-up: allocator, kernels, caches
    tokens += batch_tokens;
    c.target_seconds += seconds_of(phases, {"batch to device", "target forward"}) / batches;
    c.drafter_seconds += seconds_of(phases, {"drafter forward", "loss", "backward"}) / batches;
    c.optimizer_seconds += seconds_of(step, {"optimizer"}) / batches;
  }
  c.tokens_per_batch = tokens / batches;
  return c;
}

SplitForecast forecast_split(const Calibration& c, int targets, int drafters, int64_t global_batch) {
  SplitForecast f;
  f.target_ranks = targets;
  f.drafter_ranks = drafters;
  const double G = static_cast<double>(global_batch);
  const double step_tokens = G * c.tokens_per_batch;
  const double target_time = std::ceil(G / targets) * c.target_seconds;
  const double drafter_time = std::ceil(G / drafters) * c.drafter_seconds + c.optimizer_seconds;
  f.target_tokens_per_s = target_time > 0 ? step_tokens / target_time : 0;
  f.drafter_tokens_per_s = drafter_time > 0 ? step_tokens / drafter_time : 0;
  f.tokens_per_s = std::min(f.target_tokens_per_s, f.drafter_tokens_per_s);
  f.bound = f.target_tokens_per_s < f.drafter_tokens_per_s ? "target" : "drafter";
  return f;
}

std::vector<SplitForecast> forecast_splits(const Calibration& c, int world, int64_t global_batch) {
  std::vector<SplitForecast> out;
  for (int t = 1; t < world; ++t)
    if (global_batch >= std::max(t, world - t)) out.push_back(forecast_split(c, t, world - t, global_batch));
  std::stable_sort(out.begin(), out.end(), [](const SplitForecast& a, const SplitForecast& b) { return a.tokens_per_s > b.tokens_per_s; });
  return out;
}

nlohmann::json calibration_to_json(const Calibration& c, const std::vector<SplitForecast>& splits, const SplitForecast& chosen) {
  auto split_json = [](const SplitForecast& f) {
    return nlohmann::json{{"target_ranks", f.target_ranks}, {"drafter_ranks", f.drafter_ranks},
                          {"target_tokens_per_s", f.target_tokens_per_s}, {"drafter_tokens_per_s", f.drafter_tokens_per_s},
                          {"tokens_per_s", f.tokens_per_s}, {"bound", f.bound}};
  };
  nlohmann::json all = nlohmann::json::array();
  for (const auto& f : splits) all.push_back(split_json(f));
  return {{"device", c.device}, {"batches", c.batches}, {"tokens_per_batch", c.tokens_per_batch},
          {"target_seconds_per_batch", c.target_seconds}, {"drafter_seconds_per_batch", c.drafter_seconds},
          {"optimizer_seconds", c.optimizer_seconds}, {"this_split", split_json(chosen)}, {"splits", all}};
}

std::string format_calibration(const Calibration& c, const std::vector<SplitForecast>& splits, const SplitForecast& chosen) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(4);
  out << "throughput, measured on " << c.device << " over " << c.batches << " batches of " << std::setprecision(0)
      << c.tokens_per_batch << " tokens (after one to warm up):\n"
      << std::setprecision(4) << "  a target rank: " << c.target_seconds << " s per batch (the forward), "
      << rate(c.target_seconds > 0 ? c.tokens_per_batch / c.target_seconds : 0) << "\n"
      << "  a drafter rank: " << c.drafter_seconds << " s per batch (forward, loss, backward) + " << c.optimizer_seconds
      << " s per optimizer step\n\n"
      << "  split            target side          drafter side         pipeline\n";
  auto row = [&](const SplitForecast& f, const char* mark) {
    std::ostringstream name;
    name << f.target_ranks << " + " << f.drafter_ranks << mark;
    out << "  " << std::left << std::setw(16) << name.str() << std::right << std::setw(20) << rate(f.target_tokens_per_s)
        << std::setw(21) << rate(f.drafter_tokens_per_s) << std::setw(20) << rate(f.tokens_per_s) << "  " << f.bound
        << "-bound\n";
  };
  for (const auto& f : splits)
    row(f, f.target_ranks == chosen.target_ranks && f.drafter_ranks == chosen.drafter_ranks ? " (this)" : "");
  // A tie is no reason to move: only a split forecast faster is proposed.
  if (!splits.empty() && splits.front().tokens_per_s > chosen.tokens_per_s * 1.001)
    out << "\n  fastest forecast: --target-ranks " << splits.front().target_ranks << " --drafter-ranks "
        << splits.front().drafter_ranks << " (" << std::setprecision(2)
        << splits.front().tokens_per_s / std::max(1e-9, chosen.tokens_per_s) << "× this split)\n";
  out << "  (a forecast from the unit costs above: transfers and the drafter ranks' gradient reduction left out)\n";
  return out.str();
}

}  // namespace dflash::pipeline
