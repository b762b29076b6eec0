#include "train/resume.h"

#include "log/log.h"

#include <algorithm>

namespace dflash::train {

const std::vector<std::string> kChangeableOnResume = {
    "/train/steps",         "/train/output_dir",         "/train/checkpoint_every", "/train/keep_checkpoints",
    "/train/progress",      "/train/log_every",          "/train/tensorboard",      "/train/eval_every",       "/train/eval_prompts",
    "/train/eval_max_prompts", "/train/eval_max_new_tokens", "/train/eval_prompt_tokens", "/train/eval_tree_nodes", "/train/eval_tree_temperature", "/train/memory_slack",
    "/train/on_nonfinite",  "/train/max_nonfinite",      "/train/device",
    "/train/profile_phases", "/train/prefetch",        "/train/shard_optimizer", "/train/collective_timeout_s",
    "/train/mode", "/train/topology", "/train/queue_depth"};

namespace {

checkpoint::DamagedCheckpoint bad_field(const checkpoint::Checkpoint& saved, const std::string& field,
                                        const std::string& problem) {
  return checkpoint::DamagedCheckpoint(saved.dir + "/trainer_state.json: " + field + " " + problem +
                                       "; the checkpoint is damaged: resume from an intact one with --resume-from step-N");
}

std::string shown(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

// "/train/seed" → "train.seed"
std::string dotted(const std::string& pointer) {
  std::string out = pointer.substr(1);
  std::replace(out.begin(), out.end(), '/', '.');
  return out;
}

}  // namespace

ResumeState read_trainer_state(const checkpoint::Checkpoint& saved) {
  const nlohmann::json& state = saved.trainer_state;
  if (!state.is_object()) throw bad_field(saved, "(the whole file)", "is not a JSON object");
  ResumeState out;
  if (!state.contains("step") || !state["step"].is_number_integer())
    throw bad_field(saved, "step", "is missing or not an integer");
  out.step = state["step"].get<int64_t>();
  const size_t slash = saved.dir.find_last_of('/');
  const auto folder_step = checkpoint::step_of(slash == std::string::npos ? saved.dir : saved.dir.substr(slash + 1));
  if (out.step < 0 || (folder_step && *folder_step != out.step))
    throw bad_field(saved, "step", "is " + shown(state["step"]) + ", but the folder is " +
                                       (folder_step ? checkpoint::step_name(*folder_step) : "not a step-N folder"));
  if (state.contains("nonfinite_steps")) {
    if (!state["nonfinite_steps"].is_number_unsigned())
      throw bad_field(saved, "nonfinite_steps", "is " + shown(state["nonfinite_steps"]) + "; expected a count >= 0");
    out.nonfinite_steps = state["nonfinite_steps"].get<int64_t>();
    if (out.nonfinite_steps < 0 || out.nonfinite_steps > out.step)
      throw bad_field(saved, "nonfinite_steps", "is " + shown(state["nonfinite_steps"]) + ", more than the " +
                                                    std::to_string(out.step) + " steps run");
  }
  if (!state.contains("data_state")) throw bad_field(saved, "data_state", "is missing");
  out.data_state = state["data_state"].dump();
  if (state.contains("scheduler_state")) out.scheduler_state = state["scheduler_state"].dump();
  if (state.contains("plugins") && !state["plugins"].is_object())
    throw bad_field(saved, "plugins", "is " + shown(state["plugins"]) + "; expected the run's plugins (an object)");
  if (state.contains("config") && !state["config"].is_object())
    throw bad_field(saved, "config", "is " + shown(state["config"]) + "; expected the run's resolved config (an object)");
  return out;
}

namespace {

// Each difference between two configs as "train.seed: 3 → 4", into
// `allowed` when kChangeableOnResume holds its setting, else into `refused`.
void partition_config_changes(const nlohmann::json& saved, const nlohmann::json& current, std::vector<std::string>& refused,
                              std::vector<std::string>& allowed) {
  for (const auto& op : nlohmann::json::diff(saved, current)) {
    const std::string path = op.at("path");
    const bool changeable = std::any_of(kChangeableOnResume.begin(), kChangeableOnResume.end(), [&](const std::string& key) {
      return path == key || path.rfind(key + "/", 0) == 0;
    });
    const std::string kind = op.at("op");
    const std::string before = kind == "add" ? "(unset)" : shown(saved.at(nlohmann::json::json_pointer(path)));
    const std::string after = kind == "remove" ? "(unset)" : shown(op.at("value"));
    (changeable ? allowed : refused).push_back(dotted(path) + ": " + before + " → " + after);
  }
}

// The plugins' identities: another plugin or another version is refused
// (it may compute something else); the same version rebuilt is allowed.
void compare_plugins(const nlohmann::json& saved, const nlohmann::json& current, ResumeChanges& changes) {
  for (const auto& [section, now] : current.items()) {
    if (!saved.contains(section)) continue;
    const nlohmann::json& then = saved.at(section);
    const std::string who = section + " plugin '" + now.value("name", std::string("?")) + "'";
    if (then.value("name", "") != now.value("name", "")) {
      changes.refused.push_back(section + " plugin: '" + then.value("name", std::string("?")) + "' → '" +
                                now.value("name", std::string("?")) + "'");
    } else if (then.value("version", "") != now.value("version", "")) {
      changes.refused.push_back(who + ": version " + then.value("version", std::string("?")) + " → " +
                                now.value("version", std::string("?")) + " (" + now.value("file", std::string()) + ")");
    } else if (then.value("xxh64", "") != now.value("xxh64", "")) {
      changes.allowed.push_back(who + ": library rebuilt at the same version " + now.value("version", std::string()) +
                                " (xxh64 " + then.value("xxh64", std::string("?")) + " → " +
                                now.value("xxh64", std::string("?")) + ", " + now.value("file", std::string()) + ")");
    }
  }
}

}  // namespace

std::vector<std::string> config_changes(const nlohmann::json& saved, const nlohmann::json& current) {
  std::vector<std::string> refused, allowed;
  partition_config_changes(saved, current, refused, allowed);
  std::sort(refused.begin(), refused.end());
  return refused;
}

ResumeChanges resume_changes(const nlohmann::json& saved_state, const nlohmann::json& config,
                             const nlohmann::json& plugins) {
  ResumeChanges changes;
  if (saved_state.contains("config")) partition_config_changes(saved_state.at("config"), config, changes.refused, changes.allowed);
  if (saved_state.contains("plugins") && saved_state.at("plugins").is_object())
    compare_plugins(saved_state.at("plugins"), plugins, changes);
  std::sort(changes.refused.begin(), changes.refused.end());
  std::sort(changes.allowed.begin(), changes.allowed.end());
  return changes;
}

void check_resume_changes(const ResumeChanges& changes, const std::string& checkpoint_dir, bool allow_config_change) {
  auto listed = [](const std::vector<std::string>& lines) {
    std::string out;
    for (const auto& line : lines) out += "\n  " + line;
    return out;
  };
  if (!changes.refused.empty() && !allow_config_change)
    throw std::invalid_argument(
        "the run differs from the one that wrote " + checkpoint_dir + " in what shapes it (settings, plugins, their "
        "versions):" + listed(changes.refused) +
        (changes.allowed.empty() ? "" : "\nthese changes would be allowed (they do not change what it computes):" +
                                            listed(changes.allowed)) +
        "\nresuming would not continue that run. Restore those settings and plugins, give this run another "
        "train.output_dir, or pass --allow-config-change to resume with them anyway");
  if (!changes.refused.empty()) log::warn("resuming with changes that shape the run (--allow-config-change):" + listed(changes.refused));
  if (!changes.allowed.empty()) log::info("resuming with changes that do not alter what it computes:" + listed(changes.allowed));
}

std::optional<checkpoint::Checkpoint> load_resume_checkpoint(dist::Collective& world, const std::string& checkpoint_root,
                                                             std::optional<int64_t> resume_from) {
  if (resume_from && world.is_root()) {
    for (const std::string& aside : checkpoint::resume_from(checkpoint_root, *resume_from))
      log::warn("--resume-from " + checkpoint::step_name(*resume_from) + ": moved the newer checkpoint aside to " +
                checkpoint_root + "/" + aside + " (kept; delete it when it is no longer wanted)");
  }
  std::optional<std::string> folder;
  if (world.is_root()) folder = checkpoint::resume_folder(checkpoint_root);
  if (world.world_size() > 1) world.barrier("the choice of the checkpoint to resume from");
  if (!world.is_root()) folder = checkpoint::resume_folder(checkpoint_root);
  if (!folder) return std::nullopt;
  return checkpoint::load(*folder);
}

}  // namespace dflash::train
