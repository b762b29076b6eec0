#include "train/train_settings.h"

#include <stdexcept>

namespace dflash::train {
namespace {

// One key of the resolved section; a missing key or a wrong type is a bug of
// the caller (resolve_config fills and checks every key), said plainly.
template <class T>
T read(const nlohmann::json& train, const char* key, const char* section = "train.") {
  const auto it = train.find(key);
  if (it == train.end())
    throw std::invalid_argument(std::string(section) + key + " is missing from the resolved config (resolve it first)");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument(std::string(section) + key + ": " + it->dump() + " has the wrong type");
  }
}

template <class Enum>
Enum choice(const nlohmann::json& train, const char* key, std::initializer_list<std::pair<const char*, Enum>> values) {
  const std::string value = read<std::string>(train, key);
  for (const auto& [name, e] : values)
    if (value == name) return e;
  throw std::invalid_argument(std::string("train.") + key + ": '" + value + "' is not one of the schema's values");
}

}  // namespace

TrainSettings parse_train_settings(const nlohmann::json& train) {
  TrainSettings s;
  s.seed = read<uint64_t>(train, "seed");
  s.device = read<std::string>(train, "device");
  s.dtype = read<std::string>(train, "dtype");
  s.steps = read<int64_t>(train, "steps");
  s.lr = read<double>(train, "lr");
  s.grad_accumulation = read<int64_t>(train, "grad_accumulation");
  s.grad_clip = read<double>(train, "grad_clip");
  s.weight_decay = read<double>(train, "weight_decay");
  s.adam_beta1 = read<double>(train, "adam_beta1");
  s.adam_beta2 = read<double>(train, "adam_beta2");
  s.adam_eps = read<double>(train, "adam_eps");
  s.precision = choice<Precision>(train, "precision", {{"same", Precision::kSame}, {"fp32_master", Precision::kFp32Master}});
  s.teacher = choice<Teacher>(train, "teacher", {{"hidden", Teacher::kHidden}, {"none", Teacher::kNone}});
  s.mode = choice<Mode>(train, "mode", {{"colocated", Mode::kColocated}, {"disaggregated", Mode::kDisaggregated}});
  const nlohmann::json& topology = read<nlohmann::json>(train, "topology");
  s.target_ranks = read<int>(topology, "target_ranks", "train.topology.");
  s.drafter_ranks = read<int>(topology, "drafter_ranks", "train.topology.");
  s.queue_depth = read<int64_t>(train, "queue_depth");
  s.shard_optimizer = read<bool>(train, "shard_optimizer");
  s.on_nonfinite = choice<OnNonfinite>(train, "on_nonfinite", {{"skip", OnNonfinite::kSkip}, {"stop", OnNonfinite::kStop}});
  s.max_nonfinite = read<int64_t>(train, "max_nonfinite");
  s.checkpoint_every = read<int64_t>(train, "checkpoint_every");
  s.keep_checkpoints = read<int64_t>(train, "keep_checkpoints");
  s.collective_timeout_s = read<double>(train, "collective_timeout_s");
  s.output_dir = read<std::string>(train, "output_dir");
  s.progress = read<std::string>(train, "progress");
  s.log_every = read<int64_t>(train, "log_every");
  s.tensorboard = read<bool>(train, "tensorboard");
  s.prefetch = read<bool>(train, "prefetch");
  s.profile_phases = read<bool>(train, "profile_phases");
  s.eval_every = read<int64_t>(train, "eval_every");
  s.eval_prompts = read<std::string>(train, "eval_prompts");
  s.eval_max_prompts = read<int64_t>(train, "eval_max_prompts");
  s.eval_max_new_tokens = read<int64_t>(train, "eval_max_new_tokens");
  s.eval_prompt_tokens = read<int64_t>(train, "eval_prompt_tokens");
  s.eval_tree_nodes = read<int64_t>(train, "eval_tree_nodes");
  s.eval_tree_temperature = read<double>(train, "eval_tree_temperature");
  s.memory_slack = read<double>(train, "memory_slack");
  return s;
}

}  // namespace dflash::train
