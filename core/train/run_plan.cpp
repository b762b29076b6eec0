#include "train/run_plan.h"

#include "memory/memory_stats.h"
#include "plugin/plugin_kind.h"
#include "train/run.h"
#include "train/train_schema.h"

#include <dflash/sdk/torch_compat.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

namespace dflash::train {

using memory::as_bytes;
using memory::element_bytes;
using memory::fact;
using memory::LossAlonePlan;
using memory::PlanInputs;
using memory::Suggestion;
using memory::Verdict;

namespace {
DevicePlan plan_for(const host::PluginRegistry& registry, const nlohmann::json& root, const host::LossInstance* loss_instance,
                    int64_t world_size, PlanRole role);
}  // namespace

DevicePlan plan_run(const host::PluginRegistry& registry, const nlohmann::json& root, const host::LossInstance* loss_instance,
                    int64_t world_size) {
  return plan_for(registry, root, loss_instance, world_size, PlanRole::kColocated);
}

DevicePlan plan_role(const host::PluginRegistry& registry, const nlohmann::json& root, PlanRole role,
                     const host::LossInstance* loss_instance) {
  const TrainSettings train = parse_train_settings(root.at("train"));
  return plan_for(registry, root, loss_instance, role == PlanRole::kDrafterRank ? train.drafter_ranks : 1, role);
}

namespace {
DevicePlan plan_for(const host::PluginRegistry& registry, const nlohmann::json& root, const host::LossInstance* loss_instance,
                    int64_t world_size, PlanRole role) {
  const TrainSettings train = parse_train_settings(root.at("train"));
  const host::InstanceOptions options = instance_options(train);
  auto record = [&](dflash_kind kind) -> const host::PluginRecord& {
    return registry.find(kind, root.at(host::kind_section(kind)).at("plugin").get<std::string>());
  };
  auto section = [&](dflash_kind kind) {
    nlohmann::json s = root.at(host::kind_section(kind));
    s.erase("plugin");
    return s;
  };
  PlanInputs in;
  in.device = options.device;
  in.dtype = options.dtype;
  in.fp32_master = train.fp32_master();
  in.fused_adamw = c10::Device(options.device).is_cuda() && DFLASH_TORCH_AT_LEAST(2, 1);
  in.grad_accumulation = train.grad_accumulation;
  in.teacher = train.wants_teacher();
  in.slack_fraction = train.memory_slack;
  in.shard_optimizer = train.shard_optimizer;
  in.world_size = world_size;
  in.role = role;
  in.queue_depth = train.queue_depth;
  in.gemm_workspace_bytes = memory::gemm_workspace_bytes(c10::Device(options.device));
  const auto& data = record(DFLASH_KIND_DATA_SOURCE);
  const auto& target = record(DFLASH_KIND_TARGET_MODEL);
  const auto& drafter = record(DFLASH_KIND_DRAFTER);
  const auto& loss = record(DFLASH_KIND_LOSS);
  auto short_label = [](const host::PluginRecord& r) { return std::string(host::kind_section(r.kind)) + " " + r.name; };
  in.data_label = short_label(data), in.target_label = short_label(target), in.drafter_label = short_label(drafter);
  in.loss_label = short_label(loss);

  in.data = host::plan_memory(data, section(DFLASH_KIND_DATA_SOURCE), options, nlohmann::json::object());
  const nlohmann::json batch{{"rows", std::max<int64_t>(1, fact(in.data.facts, "rows", 1))},
                             {"row_length", std::max<int64_t>(1, fact(in.data.facts, "row_length", 1))}};
  in.target = host::plan_memory(target, section(DFLASH_KIND_TARGET_MODEL), options, batch);
  if (in.target.available) {
    nlohmann::json context = batch;
    context["target"] = in.target.facts;
    context["teacher"] = in.teacher;
    in.drafter = host::plan_memory(drafter, section(DFLASH_KIND_DRAFTER), options, context);
  }
  if (in.drafter.available) {
    std::optional<host::LossInstance> made;
    if (loss_instance == nullptr) made.emplace(loss, section(DFLASH_KIND_LOSS), options);
    const host::LossInstance& instance = loss_instance != nullptr ? *loss_instance : *made;
    dflash_loss_shape shape{};
    shape.struct_size = sizeof(shape);
    shape.rows = fact(in.drafter.facts, "loss_rows");
    shape.hidden = fact(in.drafter.facts, "hidden_size", fact(in.target.facts, "hidden_size"));
    // A drafter with a head of its own (ABI 1.6's loss_heads) says what the
    // loss scores: its vocabulary, a trainable weight, a teacher head of
    // another width. Otherwise the target's frozen head over its vocabulary.
    shape.vocab = fact(in.drafter.facts, "loss_vocab", fact(in.target.facts, "vocab_size"));
    shape.teacher_kind = in.teacher ? DFLASH_TEACHER_HIDDEN : DFLASH_TEACHER_NONE;
    shape.element_bytes = static_cast<int32_t>(element_bytes(in.dtype));
    shape.weight_trainable = in.drafter.facts.value("loss_weight_trainable", false) ? 1 : 0;
    const int64_t teacher_hidden = fact(in.drafter.facts, "teacher_hidden", 0);
    if (in.teacher && teacher_hidden > 0) {
      shape.separate_teacher_weight = 1;
      shape.teacher_hidden = teacher_hidden;
    }
    in.loss = instance.estimate_memory(shape);
  }
  return memory::compute_plan(in);
}
}  // namespace

LossAlonePlan plan_loss_alone(const host::PluginRegistry& registry, const nlohmann::json& root, int64_t rows,
                              int64_t vocab, int64_t hidden) {
  for (const auto& [what, value] : {std::pair<const char*, int64_t>{"--rows", rows}, {"--vocab", vocab}, {"--hidden", hidden}})
    if (value < 1) throw std::invalid_argument(std::string("plan: ") + what + " is " + std::to_string(value) + "; give at least 1");
  const TrainSettings train = parse_train_settings(root.at("train"));
  const std::string loss_name = root.at("loss").at("plugin").get<std::string>();
  const host::PluginRecord& record = registry.find(DFLASH_KIND_LOSS, loss_name);
  nlohmann::json settings = root.at("loss");
  settings.erase("plugin");
  const host::LossInstance loss(record, settings, instance_options(train));
  LossAlonePlan plan;
  plan.loss_label = record.label();
  plan.device = train.device;
  plan.dtype = train.dtype;
  plan.rows = rows;
  plan.vocab = vocab;
  plan.hidden = hidden;
  plan.teacher = train.wants_teacher();
  dflash_loss_shape shape{};
  shape.struct_size = sizeof(shape);
  shape.rows = rows;
  shape.hidden = hidden;
  shape.vocab = vocab;
  shape.teacher_kind = plan.teacher ? DFLASH_TEACHER_HIDDEN : DFLASH_TEACHER_NONE;
  shape.element_bytes = static_cast<int32_t>(element_bytes(train.dtype));
  const std::optional<host::LossMemoryEstimate> estimate = loss.estimate_memory(shape);
  if (!estimate)
    throw std::invalid_argument(plan.loss_label + " does not estimate its memory (no estimate_memory slot): the planner "
                                "cannot size it; a loss on the SDK's chunked-loss toolkit has one");
  plan.estimate = *estimate;
  plan.full_logits_bytes = as_bytes(static_cast<double>(rows) * static_cast<double>(vocab) *
                                    static_cast<double>(element_bytes(train.dtype)));
  return plan;
}

namespace {

// The largest value in [lo, hi] that fits, by bisection: `lo` fits, and
// whatever fits lies below whatever does not.
int64_t largest_that_fits(int64_t lo, int64_t hi, const std::function<bool(int64_t)>& fits) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace

Verdict check_fit(const host::PluginRegistry& registry, const nlohmann::json& root, const DevicePlan& plan,
                  int64_t available_bytes) {
  Verdict v;
  v.available_bytes = available_bytes;
  v.fits = plan.total_bytes <= available_bytes;
  if (v.fits) return v;
  v.short_by = plan.total_bytes - available_bytes;
  // Every memory knob, alone: the largest value below the current one that
  // fits. The plugins' (their schemas' memoryKnob properties), then the
  // host's own (train.queue_depth), found the same way in train_schema().
  auto search_section = [&](const std::string& section, const nlohmann::json& schema) {
    if (!schema.contains("properties") || !root.contains(section)) return;
    for (const auto& [key, property] : schema.at("properties").items()) {
      if (!property.contains("memoryKnob") || !root.at(section).contains(key)) continue;
      const int64_t current = root.at(section).at(key).get<int64_t>();
      const int64_t lowest = std::max<int64_t>(1, property.value("minimum", int64_t{1}));
      // 0 often means "automatic" (e.g. a loss's chunk size): search below a cap then.
      const int64_t highest = current > 0 ? current - 1 : 65536;
      // 1 = fits, 0 = does not, −1 = a value the plugin refuses (e.g. a token
      // budget below one row); refused values lie below the valid ones. Each
      // value is planned once; a fitting plan's "effective" facts are kept.
      std::map<int64_t, int> verdicts;
      std::map<int64_t, nlohmann::json> effective;
      auto try_value = [&](int64_t value) {
        auto known = verdicts.find(value);
        if (known != verdicts.end()) return known->second;
        nlohmann::json candidate = root;
        candidate[section][key] = value;
        int verdict = -1;
        try {
          const DevicePlan p = plan_for(registry, candidate, nullptr, plan.world_size, plan.role);
          verdict = p.complete() && p.total_bytes <= available_bytes ? 1 : 0;
          if (verdict == 1) effective[value] = p.facts.at("effective");
        } catch (const std::exception&) {
        }
        return verdicts[value] = verdict;
      };
      if (highest < lowest) continue;
      int64_t lo = lowest;
      if (try_value(lo) < 0) {  // the smallest value the plugin accepts
        int64_t bad = lo, good = current > 0 ? current : highest;
        if (try_value(good) < 0) continue;
        while (good - bad > 1) {
          const int64_t mid = bad + (good - bad) / 2;
          (try_value(mid) < 0 ? bad : good) = mid;
        }
        lo = good;
      }
      if (lo > highest || try_value(lo) != 1) continue;
      lo = largest_that_fits(lo, highest, [&](int64_t value) { return try_value(value) == 1; });
      Suggestion s{section, key, property.at("memoryKnob").get<std::string>(), current, lo};
      // A plugin that rounds the value (rows = budget / row length) says what it uses.
      const nlohmann::json& used = effective.at(lo);
      if (used.contains(section) && used.at(section).contains(key)) s.value = used.at(section).at(key).get<int64_t>();
      v.suggestions.push_back(s);
    }
  };
  for (dflash_kind kind : host::kAllKinds) {
    const std::string section = host::kind_section(kind);
    if (!root.contains(section) || !root.at(section).contains("plugin")) continue;
    search_section(section, registry.find(kind, root.at(section).at("plugin").get<std::string>()).schema);
  }
  // The host's knobs change a plan only where they apply (a queue only on a
  // drafter rank); elsewhere every value plans the same and none is proposed.
  search_section("train", train_schema());
  return v;
}

}  // namespace dflash::train
