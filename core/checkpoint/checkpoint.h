// Training checkpoints: <root>/step-<NNNNNNNN>/ holds the drafter as a Hugging
// Face-style directory (config.json + model.safetensors) and what resuming
// needs (optimizer.safetensors, trainer_state.json, which also records the
// size and XXH64 of every other file). `<root>/latest` names the newest.
//
// The guarantees (docs/training.md, "Checkpoints and resume"):
// - A checkpoint is written into <root>/.tmp-step-N, every file fsynced, and
//   only then put in place; `latest` is replaced after that (write, fsync,
//   rename). A step saved again is swapped in atomically (renameat2
//   RENAME_EXCHANGE), so the folder `latest` names is never deleted before its
//   replacement is durable.
// - Old checkpoints are renamed away before they are deleted: no step-*
//   folder is ever left half deleted.
// - Resuming repairs what a crash can leave (a `latest` naming a folder whose
//   swap was cut off, a missing `latest` beside complete step folders) with a
//   log line, verifies the checksums and that the weights are finite, and
//   refuses a damaged checkpoint, naming the newest intact one.
#pragma once

#include "plugin/host_api.h"

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::checkpoint {

struct Checkpoint {
  std::string dir;
  host::NamedTensors weights, optimizer;
  nlohmann::json trainer_state;
};

// A checkpoint whose files do not match what was written (checksums, sizes,
// non-finite weights, unreadable state). The message names the file.
class DamagedCheckpoint : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// mkdir -p: creates path and its missing parents; throws naming the one that fails.
void make_directories(const std::string& path);
// Writes `text` as the file `path` whole or not at all: a temporary beside
// it, synced to disk, then renamed into place. Throws naming the file.
void write_file_whole(const std::string& path, const std::string& text);
// Before the first step: that checkpoints can be written under root (it is
// created, and a probe file written, synced and removed). Throws
// std::runtime_error naming the path and the reason, so a run that could
// never save stops before it trains, not at its first checkpoint.
void check_writable(const std::string& root);

std::string step_name(int64_t step);                               // step-00000012
std::optional<int64_t> step_of(const std::string& folder_name);    // step-00000012 → 12

// Writes the checkpoint of `step` and returns its directory. Keeps the
// `keep` newest step-* folders. trainer_state gets a "files" record.
std::string save(const std::string& root, int64_t step, const nlohmann::json& drafter_config,
                 const host::NamedTensors& weights, const host::NamedTensors& optimizer,
                 const nlohmann::json& trainer_state, int64_t keep);

// The folder a resume starts from: the one `latest` names, after repairing
// what an interrupted save can leave (logged). nullopt when root holds no
// checkpoint. Throws naming the problem, and the --resume-from that fixes
// it, when `latest` names a folder that is gone.
std::optional<std::string> resume_folder(const std::string& root);

// Loads a checkpoint folder after verifying it. Throws DamagedCheckpoint.
Checkpoint load(const std::string& dir);
// resume_folder + load; nullopt when root holds no checkpoint.
std::optional<Checkpoint> load_latest(const std::string& root);

// The problem with a checkpoint folder, or "" when it is intact (every file
// present, sizes and checksums as recorded). Reads every byte.
std::string verify(const std::string& dir);
// step-* folder names under root that verify, newest first.
std::vector<std::string> intact_checkpoints(const std::string& root);

// --resume-from: step-* folders newer than `step` are renamed to
// abandoned-step-N[-K] (kept, never deleted) and `latest` names step's folder.
// Returns the names set aside.
std::vector<std::string> resume_from(const std::string& root, int64_t step);

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

// Restoring a drafter's tensors in place from a checkpoint's weights (resume
// and eval alike). The first tensor of `into` that `saved` cannot fill:
// missing, of another shape, or — exact_dtype — of another dtype (else a
// saved tensor is converted on copy: a bf16 run's weights into an fp32
// eval). Callers word the error for their own command.
struct TensorMismatch {
  enum class Kind { kMissing, kShape, kDtype };
  Kind kind = Kind::kMissing;
  std::string name;
  at::Tensor saved, wanted;  // saved undefined when missing
};
std::optional<TensorMismatch> first_mismatch(const std::map<std::string, at::Tensor>& saved,
                                             const host::NamedTensors& into, bool exact_dtype);
// Copies saved[name] into each tensor of `into`, which first_mismatch found
// all fillable (nothing is copied before every tensor is known to fit).
void copy_saved(const std::map<std::string, at::Tensor>& saved, const host::NamedTensors& into);

// JSON text for files the host writes: strings that are not valid UTF-8
// (a path, say) are written with U+FFFD instead of failing the write.
std::string json_text(const nlohmann::json& value, int indent = -1);

}  // namespace dflash::checkpoint
