// Resuming a run: the trainer state of a checkpoint, every field checked
// before anything acts on it, and the settings that changed since the
// checkpoint was written.
#pragma once

#include "checkpoint/checkpoint.h"
#include "dist/collective.h"

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

// What differs between the run a checkpoint recorded and this one, sorted:
// `refused` alters what the run computes (a setting that shapes it, another
// plugin, another version of one), `allowed` does not (a setting in
// kChangeableOnResume, a library rebuilt at the same version). Each line
// says what changed, e.g. "loss plugin 'kl': version 1.0.0 → 1.1.0".
struct ResumeChanges {
  std::vector<std::string> refused, allowed;
};
// `saved_state`: the checkpoint's trainer state ("config", and "plugins" as
// {section: plugin_identity}); either may be absent in older checkpoints.
ResumeChanges resume_changes(const nlohmann::json& saved_state, const nlohmann::json& config,
                             const nlohmann::json& plugins);

// Settings a resumed run may change without changing what it computes
// (paths to results, logging, evaluation) or that extend it (steps).
extern const std::vector<std::string> kChangeableOnResume;

// Refuses a resume whose changes alter what the run computes (unless
// `allow_config_change`), saying which changes are refused and which are
// allowed; logs the allowed ones.
void check_resume_changes(const ResumeChanges& changes, const std::string& checkpoint_dir, bool allow_config_change);

// The checkpoint a run resumes from, on every rank of `world` (each calls
// this): rank 0 settles which is the newest (moving newer ones aside for
// --resume-from, recovering `latest`); the others read it after. nullopt
// when there is none.
std::optional<checkpoint::Checkpoint> load_resume_checkpoint(dist::Collective& world, const std::string& checkpoint_root,
                                                             std::optional<int64_t> resume_from);

}  // namespace dflash::train
