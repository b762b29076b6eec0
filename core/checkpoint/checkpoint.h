// Training checkpoints: <root>/step-<NNNNNNNN>/ holds the drafter as a Hugging
// Face-style directory (config.json + model.safetensors) and what resuming
// needs (optimizer.safetensors, trainer_state.json). A checkpoint is written
// into a hidden temporary directory and renamed into place, then
// <root>/latest is replaced the same way: a crash at any moment leaves the
// last good checkpoint whole and `latest` naming it.
#pragma once

#include "plugin/host_api.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace dflash::checkpoint {

struct Checkpoint {
  std::string dir;
  host::NamedTensors weights, optimizer;
  nlohmann::json trainer_state;
};

// mkdir -p: creates path and its missing parents; throws naming the one that fails.
void make_directories(const std::string& path);

// Returns the checkpoint's directory. Keeps the `keep` newest step-* folders.
std::string save(const std::string& root, int64_t step, const nlohmann::json& drafter_config,
                 const host::NamedTensors& weights, const host::NamedTensors& optimizer,
                 const nlohmann::json& trainer_state, int64_t keep);

// The checkpoint `latest` names, or nullopt when root holds none. Throws
// naming the file when one is present but unreadable.
std::optional<Checkpoint> load_latest(const std::string& root);
Checkpoint load(const std::string& dir);

// A drafter as a Hugging Face-style directory: its config.json and the
// tensors of model.safetensors. `path` may be that directory, a checkpoint
// root holding `latest`, or a run's output_dir (its checkpoints/latest).
// Throws naming the path and what is missing.
struct DrafterDirectory {
  std::string dir;
  nlohmann::json config;
  host::NamedTensors weights;
};
DrafterDirectory load_drafter(const std::string& path);

}  // namespace dflash::checkpoint
