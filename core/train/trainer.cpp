#include "train/trainer.h"

#include "train/batch_lookahead.h"
#include "train/loss_metrics.h"
#include "plugin/plugin_identity.h"
#include "train/phase_timer.h"
#include "train/stop_request.h"

#include "checkpoint/checkpoint.h"
#include "log/log.h"
#include "memory/memory_stats.h"
#include "memory/oom_report.h"
#include "metrics/progress.h"
#include "train/adamw.h"
#include "eval/evaluation.h"
#include "train/frozen_weights.h"
#include "train/resume.h"
#include "train/run_directory.h"

#include <dflash/sdk/splitmix.hpp>
#include <dflash/sdk/torch.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>


#include <chrono>
#include <fstream>
#include <iostream>
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
// resume and A/B arms see the same blocks. Everything it makes lives in `mb`,
// which the caller owns: an out-of-memory report can still name the batch
// and the features when the failure comes half-way.
struct MicroBatch {
  host::NamedTensors on_device, hidden;  // the batch on the device; the target's outputs
  host::NamedTensors drafted;
  host::LossCall call;
  host::LossOutput out;
};
void micro_batch(TrainPlugins& p, const Wiring& w, const host::NamedTensors& batch, const c10::Device& device,
                 bool want_teacher, uint64_t seed, int64_t step, int64_t micro, MicroBatch& mb, std::string& phase,
                 PhaseTimer& timer) {
  mb = MicroBatch{};
  phase = "target forward";
  for (const auto& [name, tensor] : batch) mb.on_device.emplace_back(name, tensor.to(device));
  timer.end("batch to device");
  mb.hidden = p.target.forward(mb.on_device, w.layer_ids, want_teacher, /*want_logits=*/false);
  timer.end("target forward");
  phase = "drafter forward + loss";
  host::NamedTensors inputs = batch;
  for (const auto& entry : mb.hidden) inputs.push_back(entry);
  const uint64_t sample_seed = sdk::splitmix64(seed ^ sdk::splitmix64(static_cast<uint64_t>(step) * 4096 + static_cast<uint64_t>(micro)));
  inputs.emplace_back("sample_seed", at::scalar_tensor(static_cast<int64_t>(sample_seed >> 1), at::kLong));
  mb.drafted = p.drafter.forward(inputs);
  timer.end("drafter forward");
  mb.call.hidden = require_tensor(mb.drafted, "hidden", "the drafter");
  mb.call.lm_head_weight = w.lm_head;
  mb.call.targets = require_tensor(mb.drafted, "targets", "the drafter");
  mb.call.row_weights = find_tensor(mb.drafted, "row_weights");
  if (want_teacher && find_tensor(mb.drafted, "teacher_hidden").defined()) {
    mb.call.teacher = DFLASH_TEACHER_HIDDEN;
    mb.call.teacher_hidden = find_tensor(mb.drafted, "teacher_hidden");
  }
  mb.out = p.loss.compute(mb.call);
  timer.end("loss");
  // The features have been read; the drafter keeps what its backward needs.
  mb.on_device.clear();
  mb.hidden.clear();
}

// The tensors the host can name for an out-of-memory report, grouped under
// the plan's category names.
std::vector<memory::NamedGroup> nameable_tensors(const host::NamedTensors& parameters, const AdamW& optimizer,
                                                 const MicroBatch& live, const at::Tensor& lm_head) {
  memory::NamedGroup weights{"drafter weights"}, grads{"drafter gradients"}, states{"AdamW states"},
      masters{"fp32 master weights"}, batch{"batch on the device", live.on_device},
      features{"hidden-state items", live.hidden},
      frozen{"frozen verifier weights (embed_tokens, lm_head, final_norm)", {{"lm_head", lm_head}}, true};
  for (const auto& [name, tensor] : parameters) {
    weights.tensors.emplace_back(name, tensor);
    if (tensor.grad().defined()) grads.tensors.emplace_back(name + ".grad", tensor.grad());
  }
  for (const auto& [name, tensor] : optimizer.state())
    (name.rfind("master.", 0) == 0 ? masters : states).tensors.emplace_back(name, tensor);
  return {weights, grads, states, masters, batch, features, frozen};
}

std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  const size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

// Refuses a resume whose changes alter what the run computes (unless
// --allow-config-change), saying which changes are refused and which are
// allowed; logs the allowed ones.
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

// A failure inside a step, said with where it happened: "step 12,
// micro-batch 2 of 4, drafter forward + loss: ...". A plugin's error keeps
// its code (the exit status depends on it); usage errors keep their type.
[[noreturn]] void rethrow_at_step(const std::exception& e, int64_t step, int64_t micro, int64_t micro_batches,
                                  const std::string& phase) {
  if (dynamic_cast<const std::invalid_argument*>(&e) != nullptr) throw;
  std::string where = "step " + std::to_string(step);
  if (micro_batches > 1) where += ", micro-batch " + std::to_string(micro + 1) + " of " + std::to_string(micro_batches);
  if (!phase.empty()) where += ", " + phase;
  if (const auto* call = dynamic_cast<const host::PluginCallError*>(&e)) throw host::PluginCallError(call->code(), where + ": " + e.what());
  throw std::runtime_error(where + ": " + first_line(e));
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
  MicroBatch mb;
  std::string phase;
  PhaseTimer untimed(false, device);
  micro_batch(p, w, *batch, device, t.at("teacher").get<std::string>() == "hidden", t.at("seed"), 0, 0, mb, phase, untimed);
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
  // Nothing is written into the output directory before it is checked and
  // this run holds it alone.
  const std::unique_ptr<checkpoint::RunLock> own_lock = run.output_lock ? nullptr : claim_output_dir(output_dir);

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

  // Which libraries this run trains with (recorded in checkpoints, compared on resume).
  const nlohmann::json plugins_record = {{"data", host::plugin_identity(p.data.record())},
                                         {"target", host::plugin_identity(p.target.record())},
                                         {"drafter", host::plugin_identity(p.drafter.record())},
                                         {"loss", host::plugin_identity(p.loss.record())},
                                         {"scheduler", host::plugin_identity(p.scheduler.record())}};

  // Resume.
  int64_t first_step = 0;
  int64_t nonfinite_total = 0;
  if (run.resume_from) {
    for (const std::string& aside : checkpoint::resume_from(checkpoint_root, *run.resume_from))
      log::warn("--resume-from " + checkpoint::step_name(*run.resume_from) + ": moved the newer checkpoint aside to " +
                checkpoint_root + "/" + aside + " (kept; delete it when it is no longer wanted)");
  }
  if (const auto folder = checkpoint::resume_folder(checkpoint_root)) {
    const checkpoint::Checkpoint saved = checkpoint::load(*folder);
    const ResumeState state = read_trainer_state(saved);
    check_resume_changes(resume_changes(saved.trainer_state, run.resolved_config, plugins_record), saved.dir,
                         run.allow_config_change);
    const c10::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> weights(saved.weights.begin(), saved.weights.end());
    for (const auto& [name, tensor] : parameters) {
      auto it = weights.find(name);
      if (it == weights.end() || it->second.sizes() != tensor.sizes())
        throw std::runtime_error(saved.dir + "/model.safetensors: '" + name +
                                 "' is missing or misshapen for this drafter; resume with the configuration that wrote it");
      tensor.copy_(it->second);
    }
    optimizer.load_state(saved.optimizer);
    first_step = state.step;
    nonfinite_total = state.nonfinite_steps;
    p.data.load_state(state.data_state);
    if (p.scheduler.has_state() && state.scheduler_state) p.scheduler.load_state(*state.scheduler_state);
    log::info("resumed from " + saved.dir + " at step " + std::to_string(first_step));
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
    eval_settings.warmup = false;
    eval_prompts = eval::read_prompts(eval_settings, target_info);
  }

  metrics::MetricsFile metrics_file(output_dir + "/metrics.jsonl", first_step);
  metrics::ConsoleProgress progress(t.at("progress"), first_step, total_steps, t.at("log_every"));
  log::info("training " + std::to_string(parameter_count) + " drafter parameters on " + device.str() + " for steps " +
            std::to_string(first_step) + "…" + std::to_string(total_steps - 1) + "; target layers " +
            nlohmann::json(layer_ids).dump() + "; metrics in " + output_dir + "/metrics.jsonl");

  int64_t last_checkpoint_step = first_step > 0 ? first_step : -1;
  // Every batch comes through the lookahead, and every data position from
  // it: a batch fetched ahead is not yet consumed.
  BatchLookahead batches(p.data, t.at("prefetch").get<bool>());
  // data_state / scheduler_state: the positions to record (default: now).
  auto save = [&](int64_t next_step, const std::string& data_state = "", const std::string& scheduler_state = "") {
    nlohmann::json state = {{"step", next_step}, {"seed", seed},
                            {"data_state", nlohmann::json::parse(data_state.empty() ? batches.position() : data_state)},
                            {"nonfinite_steps", nonfinite_total}, {"config", run.resolved_config},
                            {"plugins", plugins_record}};
    if (p.scheduler.has_state())
      state["scheduler_state"] = nlohmann::json::parse(scheduler_state.empty() ? p.scheduler.save_state() : scheduler_state);
    const std::string dir = checkpoint::save(checkpoint_root, next_step, drafter_config, parameters, optimizer.state(), state,
                                             t.at("keep_checkpoints"));
    last_checkpoint_step = next_step;
    progress.message("checkpoint: " + dir);
    return dir;
  };

  const int64_t checkpoint_every = t.at("checkpoint_every"), max_nonfinite = t.at("max_nonfinite");
  const bool stop_on_nonfinite = t.at("on_nonfinite").get<std::string>() == "stop";
  int64_t consecutive_nonfinite = 0;
  int64_t step = first_step;
  int exit_code = 0;
  // The micro-batch in flight and where the step is: an out-of-memory error
  // is reported against them, and the positions at the step's start make
  // the emergency checkpoint exactly the last completed step.
  MicroBatch live;
  std::string phase;
  int64_t micro_at = 0;
  bool updating = false;
  PhaseTimer timer(t.at("profile_phases").get<bool>(), device);
  LossMetrics loss_metrics(p.loss.record().name);
  const StopRequest stop_request;
  for (; step < total_steps; ++step) {
    if (run.stop_after > 0 && step - first_step >= run.stop_after) break;
    if (const int sig = stop_request.signal()) {
      progress.message(std::string(stop_signal_name(sig)) + ": stopping before step " + std::to_string(step) +
                       " with a checkpoint of the steps done; run the same command to resume");
      exit_code = kStoppedOnRequest;
      break;
    }
    timer.start();
    const std::string data_state_at_start = batches.position();
    const std::string scheduler_state_at_start = p.scheduler.has_state() ? p.scheduler.save_state() : "";
    try {
      const auto start = std::chrono::steady_clock::now();
      memory::reset_peak(device);
      optimizer.zero_grad();
      double loss_sum = 0;
      int64_t target_tokens = 0, block_rows = 0;
      SlotTally tally;
      bool data_ended = false, finite = true;
      for (int64_t micro = 0; micro < accumulation; ++micro) {
        timer.end("other");
        phase = "next batch from the data source";
        std::optional<host::NamedTensors> batch = batches.next();
        timer.end("data");
        if (!batch) {
          data_ended = true;
          break;
        }
        micro_at = micro;
        micro_batch(p, wiring, *batch, device, want_teacher, seed, step, micro, live, phase, timer);
        const host::LossCall& call = live.call;
        const host::NamedTensors& drafted = live.drafted;
        const host::LossOutput& out = live.out;
        const double value = out.loss.item<double>();
        if (!std::isfinite(value)) finite = false;
        phase = "drafter backward";
        timer.end("loss value (host read)");
        (out.loss / static_cast<double>(accumulation)).backward();
        timer.end("backward");
        loss_sum += value;
        target_tokens += require_tensor(*batch, "input_ids", "the data source").numel();
        block_rows += call.hidden.size(0);
        loss_metrics.add(call, out);
        if (const at::Tensor slot = find_tensor(drafted, "slot"); slot.defined())
          tally.add(slot, loss_metrics.top1_hits(call, out), call.targets.ne(call.ignore_index), block_size);
        timer.end("slot accuracy (host read)");
        live = MicroBatch{};
      }
      if (data_ended && target_tokens == 0) {
        if (step == 0)
          throw std::runtime_error(p.data.record().label() + " yielded no batch at all: nothing was trained and nothing "
                                   "was saved. Check its data (`dflash-host config` shows the data section)");
        progress.message("the data source has ended (its epochs are done) before train.steps = " + std::to_string(total_steps));
        break;
      }
      phase = "optimizer step";
      const double grad_norm = global_grad_norm(parameters);
      if (!std::isfinite(grad_norm)) finite = false;
      const double lr = p.scheduler.lr_at(step, total_steps, base_lr);
      nlohmann::json record;
      if (finite) {
        consecutive_nonfinite = 0;
        phase = "optimizer step";
        if (clip > 0 && grad_norm > clip) scale_gradients(parameters, clip / (grad_norm + 1e-6));
        updating = true;
        optimizer.step(lr);
        updating = false;
        timer.end("grad norm + optimizer");
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
                     {"memory_source", mem.source},
                     {"loss_metrics", loss_metrics.take()}});
      if (run.memory_plan) record["memory_planned_peak_bytes"] = run.memory_plan->peak_bytes;
      if (timer.enabled()) {
        timer.end("other");
        record["phase_seconds"] = timer.take();
      }
      const bool evaluate_now = eval_every > 0 && finite && (step + 1) % eval_every == 0;
      if (evaluate_now) {
        p.drafter.set_training(false);
        const nlohmann::json report = eval::evaluate(p.target, p.drafter, eval_prompts, eval_settings, target_info);
        p.drafter.set_training(true);
        record["eval_tau"] = report.at("tau_mean");
        record["eval_acceptance_by_position"] = report.at("acceptance_by_position");
      }
      try {
        metrics_file.write(record);
      } catch (const metrics::MetricsWriteError& e) {
        progress.finish();
        throw std::runtime_error(std::string(e.what()) + "; training stopped at step " + std::to_string(step) + ". " +
                                 (last_checkpoint_step >= 0 ? "The checkpoint of step " + std::to_string(last_checkpoint_step) +
                                                                  " holds the last good state: free space and run again to resume from it"
                                                            : std::string("No checkpoint was written yet: free space and run again")));
      }
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
    } catch (const std::exception& e) {
      if (!memory::is_out_of_memory(e)) rethrow_at_step(e, step, micro_at, accumulation, phase);
      // Out of memory: report while the step's tensors are still alive, then
      // free them and save the last completed step.
      progress.finish();
      memory::OomEvent event;
      event.device = device.str();
      event.step = step;
      event.phase = phase.empty() ? "step" : phase;
      event.error = first_line(e);
      event.figures = memory::memory_now(device);
      event.plan = run.memory_plan;
      event.groups = nameable_tensors(parameters, optimizer, live, lm_head);
      const std::string report = memory::format_oom_report(event);
      std::cerr << report << std::flush;
      {
        std::ofstream file(output_dir + "/oom_report.txt");
        file << report;
      }
      metrics_file.write({{"step", step}, {"out_of_memory", event.error}, {"phase", event.phase},
                          {"memory_current_bytes", event.figures.current_bytes}, {"memory_peak_bytes", event.figures.peak_bytes}});
      // Drop every reference to the step's tensors before saving.
      live = MicroBatch{};
      event.groups.clear();
      optimizer.zero_grad();
      std::string saved;
      if (updating) {
        saved = "no emergency checkpoint: the update was half applied (the newest consistent state is " +
                (last_checkpoint_step >= 0 ? "checkpoint step " + std::to_string(last_checkpoint_step) : std::string("the start")) + ")";
      } else if (step == last_checkpoint_step || step == 0) {
        saved = step == 0 ? "no steps completed, nothing to save"
                          : "the checkpoint of step " + std::to_string(step) + " already holds the last completed step";
      } else {
        try {
          saved = "emergency checkpoint of the last completed step: " + save(step, data_state_at_start, scheduler_state_at_start);
        } catch (const std::exception& save_error) {
          saved = std::string("emergency checkpoint failed: ") + save_error.what();
        }
      }
      std::ostringstream summary;
      summary << "out of memory on " << device.str() << " at step " << step << " (" << event.phase
              << "): " << memory::short_oom_message(event.error)
              << "; measured peak " << memory::format_bytes(event.figures.peak_bytes);
      if (run.memory_plan) summary << " vs predicted " << memory::format_bytes(run.memory_plan->peak_bytes);
      summary << "; " << saved << "; report in " << output_dir << "/oom_report.txt; `dflash-host plan` proposes settings that fit";
      log::error(summary.str());
      return kOutOfMemory;
    }
  }
  progress.finish();
  // A step already saved (--stop-after at a checkpoint_every step, or a
  // resumed run whose data had ended) is not written again.
  if ((exit_code == 0 || exit_code == kStoppedOnRequest) && step != last_checkpoint_step) save(step);
  batches.settle();
  if (auto facts = p.data.describe()) log::info("data: " + facts->dump());
  return exit_code;
}

}  // namespace dflash::train
