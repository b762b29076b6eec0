#include "train/trainer.h"

#include "checkpoint/checkpoint.h"
#include "log/log.h"
#include "memory/memory_stats.h"
#include "metrics/progress.h"
#include "train/adamw.h"
#include "eval/evaluation.h"
#include "train/frozen_weights.h"

#include <dflash/sdk/splitmix.hpp>
#include <dflash/sdk/torch.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>


#include <chrono>
#include <iomanip>
#include <sstream>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>

namespace dflash::train {
namespace {


using host::find_tensor;
using host::require_tensor;

// Per-slot accuracy accumulated over the micro-batches of one step.
struct SlotTally {
  std::vector<double> correct, total;
  void add(const at::Tensor& slot, const at::Tensor& accuracy, const at::Tensor& valid, int64_t block_size) {
    if (static_cast<int64_t>(correct.size()) < block_size) {
      correct.resize(static_cast<size_t>(block_size), 0.0);
      total.resize(static_cast<size_t>(block_size), 0.0);
    }
    const at::Tensor s = slot.to(at::kCPU, at::kLong), a = accuracy.to(at::kCPU, at::kDouble), v = valid.to(at::kCPU, at::kDouble);
    const at::Tensor c = at::zeros({block_size}, at::kDouble).index_add_(0, s, a * v);
    const at::Tensor n = at::zeros({block_size}, at::kDouble).index_add_(0, s, v);
    for (int64_t k = 0; k < block_size; ++k) {
      correct[k] += c[k].item<double>();
      total[k] += n[k].item<double>();
    }
  }
};

// The target wired to the drafter: the drafter gets the target's facts and
// its own copies of the frozen weights on the drafter device; the loss needs
// the lm_head; the drafter keeps what else it needs (and where: e.g. its
// embedding in host memory), so the host drops its other copies.
struct Wiring {
  nlohmann::json target_info, drafter_config;
  at::Tensor lm_head;
  std::vector<int64_t> layer_ids;
  int64_t block_size = 1;
};
Wiring wire(TrainPlugins& p, const c10::Device& device, c10::ScalarType dtype) {
  Wiring w;
  w.target_info = p.target.describe();
  host::NamedTensors frozen = host::place_frozen_weights(p.target.frozen_weights(), p.target.record().name, device, dtype);
  p.drafter.bind_target(w.target_info, frozen);
  w.lm_head = find_tensor(frozen, "lm_head");
  frozen.clear();
  w.drafter_config = p.drafter.export_config().value_or(nlohmann::json::object());
  w.layer_ids = w.drafter_config.contains("target_layer_ids")
                    ? w.drafter_config.at("target_layer_ids").get<std::vector<int64_t>>()
                    : w.target_info.at("default_layer_ids").get<std::vector<int64_t>>();
  w.block_size = w.drafter_config.value("block_size", int64_t{1});
  return w;
}

// One micro-batch through target → drafter → loss (the loss not yet
// backpropagated). The anchors' seed is fixed by (run seed, step, micro), so
// resume and A/B arms see the same blocks.
struct MicroBatch {
  host::NamedTensors drafted;
  host::LossCall call;
  host::LossOutput out;
};
MicroBatch micro_batch(TrainPlugins& p, const Wiring& w, const host::NamedTensors& batch, const c10::Device& device,
                       bool want_teacher, uint64_t seed, int64_t step, int64_t micro) {
  host::NamedTensors on_device;
  for (const auto& [name, tensor] : batch) on_device.emplace_back(name, tensor.to(device));
  const host::NamedTensors hidden = p.target.forward(on_device, w.layer_ids, want_teacher, /*want_logits=*/false);
  host::NamedTensors inputs = batch;
  for (const auto& entry : hidden) inputs.push_back(entry);
  const uint64_t sample_seed = sdk::splitmix64(seed ^ sdk::splitmix64(static_cast<uint64_t>(step) * 4096 + static_cast<uint64_t>(micro)));
  inputs.emplace_back("sample_seed", at::scalar_tensor(static_cast<int64_t>(sample_seed >> 1), at::kLong));
  MicroBatch mb;
  mb.drafted = p.drafter.forward(inputs);
  mb.call.hidden = require_tensor(mb.drafted, "hidden", "the drafter");
  mb.call.lm_head_weight = w.lm_head;
  mb.call.targets = require_tensor(mb.drafted, "targets", "the drafter");
  mb.call.row_weights = find_tensor(mb.drafted, "row_weights");
  if (want_teacher && find_tensor(mb.drafted, "teacher_hidden").defined()) {
    mb.call.teacher = DFLASH_TEACHER_HIDDEN;
    mb.call.teacher_hidden = find_tensor(mb.drafted, "teacher_hidden");
  }
  mb.out = p.loss.compute(mb.call);
  return mb;
}

}  // namespace

host::NamedTensors first_step_gradients(TrainPlugins& p, const TrainRun& run) {
  const nlohmann::json& t = run.train;
  const c10::Device device(t.at("device").get<std::string>());
  const Wiring w = wire(p, device, dflash::sdk::parse_dtype(t.at("dtype").get<std::string>()));
  std::optional<host::NamedTensors> batch = p.data.next_batch();
  if (!batch) throw std::runtime_error(p.data.record().label() + " yielded no batch");
  const host::NamedTensors parameters = p.drafter.parameters();
  for (const auto& [name, tensor] : parameters)
    if (tensor.grad().defined()) tensor.mutable_grad() = at::Tensor();
  const MicroBatch mb = micro_batch(p, w, *batch, device, t.at("teacher").get<std::string>() == "hidden", t.at("seed"), 0, 0);
  mb.out.loss.backward();
  host::NamedTensors grads;
  for (const auto& [name, tensor] : parameters)
    grads.emplace_back(name, tensor.grad().defined() ? tensor.grad().detach().clone() : at::zeros_like(tensor));
  return grads;
}

int run_training(TrainPlugins& p, const TrainRun& run) {
  const nlohmann::json& t = run.train;
  const c10::Device device(t.at("device").get<std::string>());
  const c10::ScalarType dtype = dflash::sdk::parse_dtype(t.at("dtype").get<std::string>());
  const int64_t total_steps = t.at("steps"), accumulation = t.at("grad_accumulation");
  const uint64_t seed = t.at("seed");
  const double base_lr = t.at("lr"), clip = t.at("grad_clip");
  const bool want_teacher = t.at("teacher").get<std::string>() == "hidden";
  const std::string output_dir = t.at("output_dir");
  const std::string checkpoint_root = output_dir + "/checkpoints";
  checkpoint::make_directories(output_dir);

  const Wiring wiring = wire(p, device, dtype);
  const nlohmann::json& target_info = wiring.target_info;
  const nlohmann::json& drafter_config = wiring.drafter_config;
  const at::Tensor& lm_head = wiring.lm_head;
  const std::vector<int64_t>& layer_ids = wiring.layer_ids;
  const int64_t block_size = wiring.block_size;
  const host::NamedTensors parameters = p.drafter.parameters();
  int64_t parameter_count = 0;
  for (const auto& [name, tensor] : parameters) parameter_count += tensor.numel();

  AdamWOptions adam;
  adam.beta1 = t.at("adam_beta1");
  adam.beta2 = t.at("adam_beta2");
  adam.eps = t.at("adam_eps");
  adam.weight_decay = t.at("weight_decay");
  adam.fp32_master = t.at("precision").get<std::string>() == "fp32_master";
  AdamW optimizer(parameters, adam);

  // Resume.
  int64_t first_step = 0;
  int64_t nonfinite_total = 0;
  if (auto saved = checkpoint::load_latest(checkpoint_root)) {
    const c10::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> weights(saved->weights.begin(), saved->weights.end());
    for (const auto& [name, tensor] : parameters) {
      auto it = weights.find(name);
      if (it == weights.end() || it->second.sizes() != tensor.sizes())
        throw std::runtime_error(saved->dir + "/model.safetensors: '" + name +
                                 "' is missing or misshapen for this drafter; resume with the configuration that wrote it");
      tensor.copy_(it->second);
    }
    optimizer.load_state(saved->optimizer);
    const nlohmann::json& state = saved->trainer_state;
    first_step = state.at("step").get<int64_t>();
    nonfinite_total = state.value("nonfinite_steps", int64_t{0});
    p.data.load_state(state.at("data_state").dump());
    if (p.scheduler.has_state() && state.contains("scheduler_state")) p.scheduler.load_state(state.at("scheduler_state").dump());
    log::info("resumed from " + saved->dir + " at step " + std::to_string(first_step));
  }
  if (first_step >= total_steps) {
    log::info("the run already reached train.steps = " + std::to_string(total_steps) + "; nothing to do");
    return 0;
  }

  // Periodic speculative decoding on held-out prompts (the drafter as it is
  // at that step; nothing it does changes the training).
  const int64_t eval_every = t.at("eval_every");
  eval::EvalSettings eval_settings;
  std::vector<eval::Prompt> eval_prompts;
  if (eval_every > 0) {
    eval_settings.prompts_file = t.at("eval_prompts").get<std::string>();
    if (eval_settings.prompts_file.empty())
      throw std::invalid_argument("train.eval_every is " + std::to_string(eval_every) +
                                  " but train.eval_prompts names no prompts file; set it or set eval_every to 0");
    if (!p.target.can_decode() || !p.drafter.can_draft())
      throw std::invalid_argument("train.eval_every needs a target that decodes and a drafter that drafts (ABI 1.1); " +
                                  (p.target.can_decode() ? p.drafter.record().label() : p.target.record().label()) +
                                  " does not; set eval_every to 0");
    eval_settings.max_prompts = t.at("eval_max_prompts");
    eval_settings.max_new_tokens = t.at("eval_max_new_tokens");
    eval_settings.prompt_tokens = t.at("eval_prompt_tokens");
    eval_settings.baseline = false;
    eval_prompts = eval::read_prompts(eval_settings, target_info);
  }

  metrics::MetricsFile metrics_file(output_dir + "/metrics.jsonl", first_step);
  metrics::ConsoleProgress progress(t.at("progress"), first_step, total_steps, t.at("log_every"));
  log::info("training " + std::to_string(parameter_count) + " drafter parameters on " + device.str() + " for steps " +
            std::to_string(first_step) + "…" + std::to_string(total_steps - 1) + "; target layers " +
            nlohmann::json(layer_ids).dump() + "; metrics in " + output_dir + "/metrics.jsonl");

  auto save = [&](int64_t next_step) {
    nlohmann::json state = {{"step", next_step}, {"seed", seed}, {"data_state", nlohmann::json::parse(p.data.save_state())},
                            {"nonfinite_steps", nonfinite_total}, {"config", run.resolved_config}};
    if (p.scheduler.has_state()) state["scheduler_state"] = nlohmann::json::parse(p.scheduler.save_state());
    const std::string dir = checkpoint::save(checkpoint_root, next_step, drafter_config, parameters, optimizer.state(), state,
                                             t.at("keep_checkpoints"));
    progress.message("checkpoint: " + dir);
  };

  const int64_t checkpoint_every = t.at("checkpoint_every"), max_nonfinite = t.at("max_nonfinite");
  const bool stop_on_nonfinite = t.at("on_nonfinite").get<std::string>() == "stop";
  int64_t consecutive_nonfinite = 0;
  int64_t step = first_step;
  int exit_code = 0;
  for (; step < total_steps; ++step) {
    if (run.stop_after > 0 && step - first_step >= run.stop_after) break;
    const auto start = std::chrono::steady_clock::now();
    memory::reset_peak(device);
    optimizer.zero_grad();
    double loss_sum = 0;
    int64_t target_tokens = 0, block_rows = 0;
    SlotTally tally;
    bool data_ended = false, finite = true;
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      std::optional<host::NamedTensors> batch = p.data.next_batch();
      if (!batch) {
        data_ended = true;
        break;
      }
      const MicroBatch mb = micro_batch(p, wiring, *batch, device, want_teacher, seed, step, micro);
      const host::LossCall& call = mb.call;
      const host::NamedTensors& drafted = mb.drafted;
      const host::LossOutput& out = mb.out;
      const double value = out.loss.item<double>();
      if (!std::isfinite(value)) finite = false;
      (out.loss / static_cast<double>(accumulation)).backward();
      loss_sum += value;
      target_tokens += require_tensor(*batch, "input_ids", "the data source").numel();
      block_rows += call.hidden.size(0);
      const at::Tensor accuracy = find_tensor(out.metrics, "accuracy"), slot = find_tensor(drafted, "slot");
      if (accuracy.defined() && slot.defined() && accuracy.numel() == slot.numel())
        tally.add(slot, accuracy, call.targets.ne(-100), block_size);
    }
    if (data_ended && target_tokens == 0) {
      progress.message("the data source has ended (its epochs are done) before train.steps = " + std::to_string(total_steps));
      break;
    }
    const double grad_norm = global_grad_norm(parameters);
    if (!std::isfinite(grad_norm)) finite = false;
    const double lr = p.scheduler.lr_at(step, total_steps, base_lr);
    nlohmann::json record;
    if (finite) {
      consecutive_nonfinite = 0;
      if (clip > 0 && grad_norm > clip) scale_gradients(parameters, clip / (grad_norm + 1e-6));
      optimizer.step(lr);
    } else {
      ++consecutive_nonfinite;
      ++nonfinite_total;
      optimizer.zero_grad();
      record["skipped"] = true;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const memory::MemoryFigures mem = memory::memory_now(device);
    std::vector<double> slot_accuracy;
    double acceptance = 0, running = 1;
    for (size_t k = 1; k < tally.total.size(); ++k) {
      const double acc = tally.total[k] > 0 ? tally.correct[k] / tally.total[k] : 0.0;
      slot_accuracy.push_back(acc);
      running *= acc;
      acceptance += running;  // Σ_k Π_{i≤k} acc_i
    }
    record.update({{"step", step},
                   {"loss", loss_sum / static_cast<double>(accumulation)},
                   {"slot_accuracy", slot_accuracy},
                   {"acceptance_length_sim", acceptance},
                   {"lr", lr},
                   {"grad_norm", grad_norm},
                   {"tokens_per_s", static_cast<double>(target_tokens) / seconds},
                   {"block_tokens_per_s", static_cast<double>(block_rows) / seconds},
                   {"step_seconds", seconds},
                   {"memory_current_bytes", mem.current_bytes},
                   {"memory_peak_bytes", mem.peak_bytes},
                   {"memory_source", mem.source}});
    const bool evaluate_now = eval_every > 0 && finite && (step + 1) % eval_every == 0;
    if (evaluate_now) {
      p.drafter.set_training(false);
      const nlohmann::json report = eval::evaluate(p.target, p.drafter, eval_prompts, eval_settings, target_info);
      p.drafter.set_training(true);
      record["eval_tau"] = report.at("tau_mean");
      record["eval_acceptance_by_position"] = report.at("acceptance_by_position");
    }
    metrics_file.write(record);
    progress.update(record);
    if (evaluate_now) {
      std::ostringstream line;
      line << "step " << step + 1 << ": speculative decoding on " << eval_prompts.size() << " held-out prompts, τ = "
           << std::fixed << std::setprecision(3) << record.at("eval_tau").get<double>();
      progress.message(line.str());
    }
    if (!finite) {
      const std::string what = "step " + std::to_string(step) + ": non-finite loss or gradient";
      if (stop_on_nonfinite || consecutive_nonfinite >= max_nonfinite) {
        progress.message(what + (stop_on_nonfinite ? " (train.on_nonfinite = stop)"
                                                   : "; " + std::to_string(consecutive_nonfinite) +
                                                         " in a row reached train.max_nonfinite") +
                         "; stopping. The last checkpoint holds the last good state.");
        exit_code = kNonFinite;
        break;
      }
      progress.message(what + "; its update was skipped (train.on_nonfinite = skip)");
    }
    if (data_ended) {
      progress.message("the data source has ended (its epochs are done)");
      ++step;
      break;
    }
    if (checkpoint_every > 0 && (step + 1) % checkpoint_every == 0 && step + 1 < total_steps) save(step + 1);
  }
  progress.finish();
  if (exit_code == 0) save(step);
  if (auto facts = p.data.describe()) log::info("data: " + facts->dump());
  return exit_code;
}

}  // namespace dflash::train
