// How fast each side of a disaggregated run would go, measured: `plan
// --calibrate N` runs N data-source batches (after one to warm up) through
// the target's forward and through the drafter's forward, loss and
// backward on this process's device, times one optimizer step, and
// forecasts every split of the world from those unit costs. The model it
// states: per step, a target rank runs ⌈G/T⌉ forwards and a drafter rank
// ⌈G/D⌉ drafter passes and one optimizer step (G the global batch); the
// slower side sets the pipeline's pace. Transfers and the drafter ranks'
// gradient reduction are left out (they overlap, or cost little beside a
// step): the forecast is an upper bound to compare splits with, not a
// promise.
#pragma once

#include "train/run.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dflash::pipeline {

struct Calibration {
  std::string device;
  int batches = 0;                     // timed (after one to warm up)
  double tokens_per_batch = 0;         // mean input tokens of a data-source batch
  double target_seconds = 0;           // one batch to the device + the target's forward
  double drafter_seconds = 0;          // one batch's drafter forward, loss and backward
  double optimizer_seconds = 0;        // one optimizer step
};

// Binds `run` (every plugin in this process) and measures. Throws when the
// data source ends before batches + 1.
Calibration calibrate(train::Run& run, int batches);

struct SplitForecast {
  int target_ranks = 0, drafter_ranks = 0;
  double target_tokens_per_s = 0, drafter_tokens_per_s = 0, tokens_per_s = 0;
  std::string bound;  // "target" or "drafter"
};

// Every split of `world` ranks into T ≥ 1 target and D ≥ 1 drafter ranks
// whose global batch `global_batch` keeps every rank busy (G ≥ max(T, D)),
// the fastest first.
std::vector<SplitForecast> forecast_splits(const Calibration& c, int world, int64_t global_batch);
SplitForecast forecast_split(const Calibration& c, int targets, int drafters, int64_t global_batch);

nlohmann::json calibration_to_json(const Calibration& c, const std::vector<SplitForecast>& splits, const SplitForecast& chosen);
std::string format_calibration(const Calibration& c, const std::vector<SplitForecast>& splits, const SplitForecast& chosen);

}  // namespace dflash::pipeline
