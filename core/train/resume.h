// Resuming a run: the trainer state of a checkpoint, every field checked
// before anything acts on it, and the settings that changed since the
// checkpoint was written.
#pragma once

#include "checkpoint/checkpoint.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace dflash::train {

struct ResumeState {
  int64_t step = 0;             // the next step to run
  int64_t nonfinite_steps = 0;  // skipped updates so far
  std::string data_state;       // JSON text for the data source's load_state
  std::optional<std::string> scheduler_state;
};

// Throws checkpoint::DamagedCheckpoint naming trainer_state.json and the field.
ResumeState read_trainer_state(const checkpoint::Checkpoint& saved);

// The settings that shape a run (everything but those in
// kChangeableOnResume) that differ between the config a checkpoint recorded
// and this run's, as "train.seed: 3 → 4" lines.
std::vector<std::string> config_changes(const nlohmann::json& saved, const nlohmann::json& current);

// Settings a resumed run may change without changing what it computes
// (paths to results, logging, evaluation) or that extend it (steps).
extern const std::vector<std::string> kChangeableOnResume;

}  // namespace dflash::train
