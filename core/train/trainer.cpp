#include "train/trainer.h"

#include "checkpoint/checkpoint.h"
#include "dist/gradient_reducer.h"
#include "eval/evaluation.h"
#include "log/log.h"
#include "memory/memory_stats.h"
#include "memory/oom_report.h"
#include "metrics/progress.h"
#include "metrics/tensorboard.h"
#include "train/adamw.h"
#include "train/sharded_adamw.h"
#include "train/batch_lookahead.h"
#include "train/loss_metrics.h"
#include "train/phase_timer.h"
#include "train/resume.h"
#include "train/run_directory.h"
#include "train/stages.h"
#include "train/stop_request.h"

#include <dflash/sdk/torch.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
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

// The tensors the host can name for an out-of-memory report, grouped under
// the plan's category names.
std::vector<memory::NamedGroup> nameable_tensors(const host::NamedTensors& parameters, const Optimizer& optimizer,
                                                 const MicroBatch& live, const at::Tensor& lm_head) {
  memory::NamedGroup weights{"drafter weights"}, grads{"drafter gradients"}, states{"AdamW states"},
      masters{"fp32 master weights"}, batch{"batch on the device", live.on_device},
      features{"hidden-state items", live.hidden},
      frozen{"frozen verifier weights (embed_tokens, lm_head, final_norm)", {{"lm_head", lm_head}}, true};
  for (const auto& [name, tensor] : parameters) {
    weights.tensors.emplace_back(name, tensor);
    if (tensor.grad().defined()) grads.tensors.emplace_back(name + ".grad", tensor.grad());
  }
  for (const auto& [name, tensor] : optimizer.local_state())
    (name.rfind("master.", 0) == 0 ? masters : states).tensors.emplace_back(name, tensor);
  return {weights, grads, states, masters, batch, features, frozen};
}

std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  const size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

// A failure inside a step, said with where it happened: "step 12,
// micro-batch 2 of 4, drafter forward + loss: ...". A plugin's error keeps
// its code (the exit status depends on it); usage errors keep their type.
[[noreturn]] void rethrow_at_step(const std::exception& e, int64_t step, int64_t micro, int64_t micro_batches,
                                  const std::string& phase) {
  if (dynamic_cast<const std::invalid_argument*>(&e) != nullptr) throw;
  if (dynamic_cast<const dist::CollectiveError*>(&e) != nullptr) throw;
  std::string where = "step " + std::to_string(step);
  if (micro_batches > 1 && micro >= 0)  // micro < 0: a stage of the whole step
    where += ", micro-batch " + std::to_string(micro + 1) + " of " + std::to_string(micro_batches);
  if (!phase.empty()) where += ", " + phase;
  if (const auto* call = dynamic_cast<const host::PluginCallError*>(&e)) throw host::PluginCallError(call->code(), where + ": " + e.what());
  throw std::runtime_error(where + ": " + first_line(e));
}

// What one step adds up to on this rank, then (reduce) over all ranks.
struct StepFigures {
  double loss_sum = 0;  // Σ of the micro-batches' loss values
  int64_t micro_batches = 0, target_tokens = 0, loss_rows = 0;
  bool data_ended = false;
  int stop_signal = 0;  // SIGTERM/SIGINT seen by this rank (then by any: the largest)
  SlotTally tally;
  bool slots_seen = false;
};

// The finite-loss check, the metrics' sums and the slot tally over the
// ranks, in one all-reduce; and every rank's own figures, for the record.
struct RankFigures {
  std::vector<nlohmann::json> ranks;  // rank order; empty on one process
};
void reduce_figures(StepFigures& f, int64_t block_size, dist::Collective& group, double seconds, int64_t peak_bytes,
                    RankFigures& out) {
  if (group.world_size() == 1) return;
  const int64_t k = block_size;
  at::Tensor v = at::zeros({6 + 2 * k}, at::kDouble);
  double* p = v.data_ptr<double>();
  p[0] = f.loss_sum;
  p[1] = static_cast<double>(f.micro_batches);
  p[2] = static_cast<double>(f.target_tokens);
  p[3] = static_cast<double>(f.loss_rows);
  p[4] = f.data_ended ? 1 : 0;
  p[5] = f.slots_seen ? 1 : 0;
  for (int64_t i = 0; i < k && i < static_cast<int64_t>(f.tally.correct.size()); ++i) {
    p[6 + i] = f.tally.correct[static_cast<size_t>(i)];
    p[6 + k + i] = f.tally.total[static_cast<size_t>(i)];
  }
  // Every rank's own figures, and the stop signal it saw (any rank's stops all).
  const at::Tensor mine = at::tensor({f.loss_sum, static_cast<double>(f.micro_batches), static_cast<double>(f.target_tokens),
                                      seconds, static_cast<double>(peak_bytes), static_cast<double>(f.stop_signal)},
                                     at::kDouble);
  group.all_reduce_sum(v, "the step's figures");
  std::vector<at::Tensor> each;
  group.all_gather(each, mine, "every rank's figures");
  f.loss_sum = p[0];
  f.micro_batches = static_cast<int64_t>(p[1]);
  f.target_tokens = static_cast<int64_t>(p[2]);
  f.loss_rows = static_cast<int64_t>(p[3]);
  f.data_ended = p[4] > 0;
  f.slots_seen = p[5] > 0;
  if (f.slots_seen) {
    f.tally.correct.assign(p + 6, p + 6 + k);
    f.tally.total.assign(p + 6 + k, p + 6 + 2 * k);
  }
  for (size_t r = 0; r < each.size(); ++r) {
    const at::Tensor e = each[r].to(at::kCPU, at::kDouble);
    const double* q = e.data_ptr<double>();
    f.stop_signal = std::max(f.stop_signal, static_cast<int>(q[5]));
    out.ranks.push_back({{"rank", r},
                         {"loss", q[1] > 0 ? nlohmann::json(q[0] / q[1]) : nlohmann::json(nullptr)},
                         {"micro_batches", static_cast<int64_t>(q[1])},
                         {"tokens", static_cast<int64_t>(q[2])},
                         {"step_seconds", q[3]},
                         {"memory_peak_bytes", static_cast<int64_t>(q[4])}});
  }
}

// Colocated: every rank reads every batch of the step in the data source's
// order (so the data position is the same on every rank, and at every world
// size); micro-batch i of the step is rank i mod W's, which runs its own
// target on it.
class ColocatedFeed final : public MicroBatchFeed {
 public:
  ColocatedFeed(const Run& run, dist::Collective& group) : run_(run), group_(group), batches_(run.data(), run.settings().prefetch) {}
  Got next(int64_t, int64_t micro, MicroBatch& mb, std::string& phase, PhaseTimer& timer) override {
    phase = "next batch from the data source";
    std::optional<host::NamedTensors> batch = batches_.next();
    timer.end("data");
    if (!batch) return Got::kEnded;
    if (micro % group_.world_size() != group_.rank()) return Got::kOthers;
    mb.batch = std::move(*batch);
    produce(run_, mb, phase, timer);
    return Got::kMine;
  }
  std::string position_after(int64_t) override { return batches_.position(); }
  void finish() override { batches_.settle(); }

 private:
  const Run& run_;
  dist::Collective& group_;
  BatchLookahead batches_;
};

class Trainer {
 public:
  Trainer(Run& run, const RunOptions& options, const TrainingRanks& ranks)
      : run_(run),
        s_(run.settings()),
        options_(options),
        world_(ranks.world),
        group_(ranks.trainers),
        make_feed_(ranks.feed),
        device_(s_.device),
        output_dir_(s_.output_dir),
        checkpoint_root_(output_dir_ + "/checkpoints"),
        timer_(s_.profile_phases, device_),
        loss_metrics_(run.loss().record().name) {}

  int train();

 private:
  bool root() const { return group_.is_root(); }
  // Before the first step: the drafter's parameters and the optimizer,
  // resumed from the newest checkpoint when there is one.
  void set_up();
  void resume();
  // What a checkpoint's model.safetensors holds: the parameters, then the buffers.
  host::NamedTensors saved_tensors() const {
    host::NamedTensors all = parameters_;
    all.insert(all.end(), buffers_.begin(), buffers_.end());
    return all;
  }
  void set_up_evaluation();
  // One step: every stage. What comes next:
  enum class Next {
    kStep,         // the next step
    kEndAfter,     // the data ended with this step: it counts as done
    kEndBefore,    // the data ended before this step trained anything
    kStop          // stopped (exit_code_ says why: non-finite losses, out of memory)
  };
  Next step(int64_t step);
  void consume(MicroBatch& mb, int64_t step, int64_t micro, bool last_on_rank, StepFigures& f);
  void reduce(int64_t step);
  // Clipping and the optimizer (the scheduler's rate); false when skipped (non-finite).
  bool update(double grad_norm, double lr, bool finite);
  // The step's record: metrics.jsonl, the console, evaluation; checkpoint.
  bool record(int64_t step, StepFigures& f, const RankFigures& ranks, double lr, double grad_norm, bool finite,
              double seconds, const memory::MemoryFigures& mem);
  std::string save(int64_t next_step, const std::string& data_state = "", const std::string& scheduler_state = "");
  int out_of_memory(const std::exception& e, int64_t step, const std::string& data_state_at_start,
                    const std::string& scheduler_state_at_start);

  Run& run_;
  const TrainSettings& s_;
  const RunOptions& options_;
  dist::Collective& world_;  // every rank of the run
  dist::Collective& group_;  // the ranks that train (colocated: the world)
  std::function<std::unique_ptr<MicroBatchFeed>(int64_t)> make_feed_;
  const c10::Device device_;
  const std::string output_dir_, checkpoint_root_;
  std::unique_ptr<checkpoint::RunLock> own_lock_;
  host::NamedTensors parameters_;
  host::NamedTensors buffers_;  // the drafter's persistent tensors that are not trained (ABI 1.6), saved beside parameters_
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<dist::GradientReducer> reducer_;
  nlohmann::json plugins_record_;
  int64_t first_step_ = 0, nonfinite_total_ = 0, consecutive_nonfinite_ = 0;
  int64_t last_checkpoint_step_ = -1;
  eval::EvalSettings eval_settings_;
  std::vector<eval::Prompt> eval_prompts_;
  std::unique_ptr<metrics::MetricsFile> metrics_file_;
  std::unique_ptr<metrics::EventFile> event_file_;  // train.tensorboard
  std::unique_ptr<metrics::ConsoleProgress> progress_;
  std::unique_ptr<MicroBatchFeed> feed_;
  int agreed_stop_signal_ = 0;  // with several ranks: a stop signal any rank saw by the end of the last step
  PhaseTimer timer_;
  LossMetrics loss_metrics_;
  // The micro-batch in flight and where the step is: an out-of-memory error
  // is reported against them, and the positions at the step's start make
  // the emergency checkpoint exactly the last completed step.
  MicroBatch live_;
  std::string phase_;
  int64_t micro_at_ = 0;
  bool updating_ = false;
  int exit_code_ = 0;
  const StopRequest* stop_request_ = nullptr;
  nlohmann::json pipeline_figures_;
};

void Trainer::set_up() {
  // Nothing is written into the output directory before it is checked and
  // this run holds it alone; only rank 0 writes there.
  if (world_.is_root() && !options_.output_lock) own_lock_ = claim_output_dir(output_dir_);
  run_.bind();
  parameters_ = run_.drafter().parameters();
  buffers_ = run_.drafter().buffers();
  for (const auto& [name, buffer] : buffers_)
    for (const auto& parameter : parameters_)
      if (parameter.first == name)
        throw std::invalid_argument(run_.drafter().record().label() + ": '" + name +
                                    "' is both a parameter and a buffer; a checkpoint holds each name once");
  AdamWOptions adam;
  adam.beta1 = s_.adam_beta1;
  adam.beta2 = s_.adam_beta2;
  adam.eps = s_.adam_eps;
  adam.weight_decay = s_.weight_decay;
  adam.fp32_master = s_.fp32_master();
  if (s_.shard_optimizer && group_.world_size() > 1) optimizer_ = std::make_unique<ShardedAdamW>(parameters_, adam, group_);
  else optimizer_ = std::make_unique<AdamW>(parameters_, adam);
  plugins_record_ = run_.plugin_identities();
  if (group_.world_size() > 1) {
    const c10::ScalarType reduce_dtype = s_.fp32_master() ? at::kFloat : sdk::parse_dtype(s_.dtype);
    reducer_ = std::make_unique<dist::GradientReducer>(parameters_, group_, reduce_dtype);
  }
}

void Trainer::resume() {
  const std::optional<checkpoint::Checkpoint> found = load_resume_checkpoint(world_, checkpoint_root_, options_.resume_from);
  if (!found) return;
  const checkpoint::Checkpoint& saved = *found;
  const ResumeState state = read_trainer_state(saved);
  check_resume_changes(resume_changes(saved.trainer_state, run_.resolved_config(), plugins_record_), saved.dir,
                       options_.allow_config_change);
  // A tensor of another dtype would be converted number by number (an I32
  // label on float bytes trains on garbage): the run wrote its own dtype.
  // Everything is checked before anything is copied.
  const std::map<std::string, at::Tensor> weights(saved.weights.begin(), saved.weights.end());
  for (const auto& [tensors, kind] : {std::pair{&parameters_, "parameter"}, std::pair{&buffers_, "buffer"}})
    if (const std::optional<checkpoint::TensorMismatch> bad = checkpoint::first_mismatch(weights, *tensors, true)) {
      if (bad->kind != checkpoint::TensorMismatch::Kind::kDtype)
        throw std::runtime_error(saved.dir + "/model.safetensors: '" + bad->name +
                                 "' is missing or misshapen for this drafter; resume with the configuration that wrote it");
      throw std::runtime_error(saved.dir + "/model.safetensors: '" + bad->name + "' holds " +
                               std::string(c10::toString(bad->saved.scalar_type())) + " values where this drafter's " + kind +
                               " is " + c10::toString(bad->wanted.scalar_type()) +
                               "; the file was altered, or written with another train.dtype: resume with the "
                               "configuration that wrote it");
    }
  checkpoint::copy_saved(weights, parameters_);
  checkpoint::copy_saved(weights, buffers_);
  try {
    optimizer_->load_state(saved.optimizer);
  } catch (const std::runtime_error& e) {  // name the file the state came from
    throw std::runtime_error(saved.dir + "/optimizer.safetensors: " + e.what());
  }
  first_step_ = state.step;
  nonfinite_total_ = state.nonfinite_steps;
  if (run_.has_data()) run_.data().load_state(state.data_state);
  if (run_.scheduler().has_state() && state.scheduler_state) run_.scheduler().load_state(*state.scheduler_state);
  log::info("resumed from " + saved.dir + " at step " + std::to_string(first_step_));
}

// Periodic speculative decoding on held-out prompts (the drafter as it is
// at that step; nothing it does changes the training).
void Trainer::set_up_evaluation() {
  if (s_.eval_every == 0) return;
  eval_settings_.prompts_file = s_.eval_prompts;
  if (eval_settings_.prompts_file.empty())
    throw std::invalid_argument("train.eval_every is " + std::to_string(s_.eval_every) +
                                " but train.eval_prompts names no prompts file; set it or set eval_every to 0");
  if (!run_.target().can_decode() || !run_.drafter().can_draft())
    throw std::invalid_argument("train.eval_every needs a target that decodes and a drafter that drafts (ABI 1.1); " +
                                (run_.target().can_decode() ? run_.drafter().record().label() : run_.target().record().label()) +
                                " does not; set eval_every to 0");
  if (s_.eval_tree_nodes > 0 && !(run_.target().can_verify_tree() && run_.drafter().can_draft_topk()))
    throw std::invalid_argument("train.eval_tree_nodes is " + std::to_string(s_.eval_tree_nodes) +
                                ": draft trees need a target that verifies them and a drafter that proposes top-k candidates "
                                "(ABI 1.4); " +
                                (run_.target().can_verify_tree() ? run_.drafter().record().label() : run_.target().record().label()) +
                                " does not; set eval_tree_nodes to 0");
  eval_settings_.max_prompts = s_.eval_max_prompts;
  eval_settings_.max_new_tokens = s_.eval_max_new_tokens;
  eval_settings_.prompt_tokens = s_.eval_prompt_tokens;
  eval_settings_.baseline = false;
  eval_settings_.warmup = false;
  if (root()) eval_prompts_ = eval::read_prompts(eval_settings_, run_.target_info());
}

std::string Trainer::save(int64_t next_step, const std::string& data_state, const std::string& scheduler_state) {
  last_checkpoint_step_ = next_step;
  const host::NamedTensors optimizer_state = optimizer_->state();  // sharded: gathered from every rank
  if (!root()) return "";
  nlohmann::json state = {{"step", next_step}, {"seed", s_.seed},
                          {"data_state", nlohmann::json::parse(data_state.empty() ? feed_->position_after(next_step - 1) : data_state)},
                          {"nonfinite_steps", nonfinite_total_}, {"config", run_.resolved_config()},
                          {"plugins", plugins_record_}};
  if (run_.scheduler().has_state())
    state["scheduler_state"] = nlohmann::json::parse(scheduler_state.empty() ? run_.scheduler().save_state() : scheduler_state);
  const std::string dir = checkpoint::save(checkpoint_root_, next_step, run_.drafter_config(), saved_tensors(),
                                           optimizer_state, state, s_.keep_checkpoints);
  progress_->message("checkpoint: " + dir);
  return dir;
}

void Trainer::consume(MicroBatch& mb, int64_t step, int64_t micro, bool last_on_rank, StepFigures& f) {
  draft_and_score(run_, mb, step, micro, phase_, timer_);
  const host::LossCall& call = mb.call;
  const host::LossOutput& out = mb.out;
  const double value = out.loss.item<double>();
  phase_ = "drafter backward";
  timer_.end("loss value (host read)");
  // This rank's last backward of the step reduces its buckets as it goes.
  if (last_on_rank && reducer_) reducer_->arm(step);
  (out.loss / static_cast<double>(s_.grad_accumulation)).backward();
  timer_.end("backward");
  f.loss_sum += value;
  f.micro_batches += 1;
  f.target_tokens += require_tensor(mb.batch, "input_ids", "the data source").numel();
  f.loss_rows += call.hidden.size(0);
  loss_metrics_.add(call, out);
  if (const at::Tensor slot = find_tensor(mb.drafted, "slot"); slot.defined()) {
    f.tally.add(slot, loss_metrics_.top1_hits(call, out), call.targets.ne(call.ignore_index), run_.drafter_facts().block_size);
    f.slots_seen = true;
  }
  timer_.end("slot accuracy (host read)");
}

void Trainer::reduce(int64_t step) {
  if (!reducer_) return;
  phase_ = "gradient reduction";
  // A rank whose last micro-batch of the step never came (the data ended)
  // armed nothing: it reduces what .grad holds.
  if (!reducer_->armed()) reducer_->arm(step);
  reducer_->finish();
  timer_.end("gradient reduction");
}

bool Trainer::update(double grad_norm, double lr, bool finite) {
  if (!finite) {
    ++consecutive_nonfinite_;
    ++nonfinite_total_;
    optimizer_->zero_grad();
    return false;
  }
  consecutive_nonfinite_ = 0;
  phase_ = "optimizer step";
  updating_ = true;
  optimizer_->step(lr, clip_factor(grad_norm, s_.grad_clip));
  updating_ = false;
  timer_.end("grad norm + optimizer");
  return true;
}

bool Trainer::record(int64_t step, StepFigures& f, const RankFigures& ranks, double lr, double grad_norm, bool finite,
                     double seconds, const memory::MemoryFigures& mem) {
  nlohmann::json record;
  if (!finite) record["skipped"] = true;
  std::vector<double> slot_accuracy;
  double acceptance = 0, running = 1;
  for (size_t k = 1; k < f.tally.total.size(); ++k) {
    const double acc = f.tally.total[k] > 0 ? f.tally.correct[k] / f.tally.total[k] : 0.0;
    slot_accuracy.push_back(acc);
    running *= acc;
    acceptance += running;  // Σ_k Π_{i≤k} acc_i
  }
  record.update({{"step", step},
                 {"loss", f.loss_sum / static_cast<double>(s_.grad_accumulation)},
                 {"slot_accuracy", slot_accuracy},
                 {"acceptance_length_sim", acceptance},
                 {"lr", lr},
                 {"grad_norm", grad_norm},
                 {"tokens_per_s", static_cast<double>(f.target_tokens) / seconds},
                 {"loss_rows_per_s", static_cast<double>(f.loss_rows) / seconds},
                 {"step_seconds", seconds},
                 {"memory_current_bytes", mem.current_bytes},
                 {"memory_peak_bytes", mem.peak_bytes},
                 {"memory_source", mem.source},
                 {"loss_metrics", loss_metrics_.take(&group_)}});
  if (options_.memory_plan) record["memory_planned_peak_bytes"] = options_.memory_plan->peak_bytes;
  if (!ranks.ranks.empty() || world_.world_size() > 1) {
    record["world_size"] = world_.world_size();
    if (!ranks.ranks.empty()) record["ranks"] = ranks.ranks;
  }
  if (!pipeline_figures_.is_null()) record["pipeline"] = pipeline_figures_;
  if (timer_.enabled()) {
    timer_.end("other");
    record["phase_seconds"] = timer_.take();
  }
  const bool evaluate_now = s_.eval_every > 0 && finite && (step + 1) % s_.eval_every == 0;
  if (evaluate_now && root()) {
    run_.drafter().set_training(false);
    // The chain, and with train.eval_tree_nodes the same prompts verified as
    // DDTree draft trees: two arms of one evaluation.
    std::vector<eval::Verification> arms = {eval_settings_.verification};
    if (s_.eval_tree_nodes > 0)
      arms.push_back({eval::Verification::Kind::kTree, s_.eval_tree_nodes, s_.eval_tree_temperature});
    const std::vector<nlohmann::json> reports = eval::evaluate_arms(run_.target(), run_.drafter(), run_.drafter_facts(),
                                                                    eval_prompts_, eval_settings_, arms, run_.target_info());
    record["eval_tau"] = reports.front().at("tau_mean");
    record["eval_acceptance_by_position"] = reports.front().at("acceptance_by_position");
    if (reports.size() > 1) {
      record["eval_tree_tau"] = reports.back().at("tau_mean");
      record["eval_tree_nodes"] = s_.eval_tree_nodes;
      if (s_.eval_tree_temperature != 1.0) record["eval_tree_temperature"] = s_.eval_tree_temperature;
    }
    run_.drafter().set_training(true);
  }
  if (root()) {
    try {
      metrics_file_->write(record);
      if (event_file_) event_file_->write(record);
    } catch (const metrics::MetricsWriteError& e) {
      progress_->finish();
      throw std::runtime_error(std::string(e.what()) + "; training stopped at step " + std::to_string(step) + ". " +
                               (last_checkpoint_step_ >= 0 ? "The checkpoint of step " + std::to_string(last_checkpoint_step_) +
                                                                " holds the last good state: free space and run again to resume from it"
                                                          : std::string("No checkpoint was written yet: free space and run again")));
    }
  }
  progress_->update(record);
  if (root() && pipeline_figures_.contains("advice") && (step + 1) % s_.log_every == 0)
    progress_->message(pipeline_figures_.at("advice").get<std::string>());
  if (evaluate_now && root()) {
    std::ostringstream line;
    line << "step " << step + 1 << ": speculative decoding on " << eval_prompts_.size() << " held-out prompts, τ = "
         << std::fixed << std::setprecision(3) << record.at("eval_tau").get<double>();
    if (record.contains("eval_tree_tau"))
      line << " (draft trees of " << s_.eval_tree_nodes << " nodes: τ = " << record.at("eval_tree_tau").get<double>() << ")";
    progress_->message(line.str());
  }
  if (!finite) {
    const std::string what = "step " + std::to_string(step) + ": non-finite loss or gradient";
    const bool stop_on_nonfinite = s_.on_nonfinite == OnNonfinite::kStop;
    if (stop_on_nonfinite || consecutive_nonfinite_ >= s_.max_nonfinite) {
      progress_->message(what + (stop_on_nonfinite ? " (train.on_nonfinite = stop)"
                                                   : "; " + std::to_string(consecutive_nonfinite_) +
                                                         " in a row reached train.max_nonfinite") +
                         "; stopping. The last checkpoint holds the last good state.");
      exit_code_ = kExitNonFinite;
      return false;
    }
    progress_->message(what + "; its update was skipped (train.on_nonfinite = skip)");
  }
  return true;
}

Trainer::Next Trainer::step(int64_t step) {
  const int64_t per_step = s_.grad_accumulation;
  const int world = group_.world_size(), rank = group_.rank();
  timer_.start();
  // For an emergency checkpoint, which only a run of one process writes.
  const std::string data_state_at_start = world_.world_size() == 1 ? feed_->position_after(step - 1) : std::string();
  const std::string scheduler_state_at_start = run_.scheduler().has_state() ? run_.scheduler().save_state() : "";
  try {
    const auto start = std::chrono::steady_clock::now();
    memory::reset_peak(device_);
    optimizer_->zero_grad();
    StepFigures f;
    bool finite = true;
    // The global batch: micro-batch i of the step is training rank i mod W's
    // (the feed says which are this rank's).
    const int64_t last_mine = per_step - 1 - ((per_step - 1 - rank) % world + world) % world;
    for (int64_t micro = 0; micro < per_step; ++micro) {
      timer_.end("other");
      micro_at_ = micro;
      const MicroBatchFeed::Got got = feed_->next(step, micro, live_, phase_, timer_);
      if (got == MicroBatchFeed::Got::kEnded) {
        f.data_ended = true;
        break;
      }
      if (got == MicroBatchFeed::Got::kOthers) continue;
      consume(live_, step, micro, micro == last_mine, f);
      if (!std::isfinite(f.loss_sum)) finite = false;
      live_ = MicroBatch{};
      feed_->done();
    }
    reduce(step);
    const double seconds_so_far = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    RankFigures ranks;
    f.stop_signal = stop_request_ ? stop_request_->signal() : 0;
    reduce_figures(f, run_.drafter_facts().block_size, group_, seconds_so_far, memory::memory_now(device_).peak_bytes, ranks);
    agreed_stop_signal_ = f.stop_signal;
    pipeline_figures_ = feed_->step_figures(group_, step);
    if (!std::isfinite(f.loss_sum)) finite = false;
    if (f.data_ended && f.target_tokens == 0) {
      if (step == 0)
        throw std::runtime_error((run_.has_data() ? run_.data().record().label() : std::string("the data source")) + " yielded no batch at all: nothing was trained and nothing "
                                 "was saved. Check its data (`dflash-host config` shows the data section)");
      progress_->message("the data source has ended (its epochs are done) before train.steps = " + std::to_string(s_.steps));
      return Next::kEndBefore;
    }
    phase_ = "optimizer step";
    micro_at_ = -1;  // the stages from here on are the whole step's
    const double grad_norm = global_grad_norm(parameters_);
    if (!std::isfinite(grad_norm)) finite = false;
    const double lr = run_.scheduler().lr_at(step, s_.steps, s_.lr);
    update(grad_norm, lr, finite);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    phase_ = "metrics";
    if (!record(step, f, ranks, lr, grad_norm, finite, seconds, memory::memory_now(device_))) return Next::kStop;
    if (f.data_ended) {
      progress_->message("the data source has ended (its epochs are done)");
      return Next::kEndAfter;
    }
    if (s_.checkpoint_every > 0 && (step + 1) % s_.checkpoint_every == 0 && step + 1 < s_.steps) {
      phase_ = "checkpoint save";  // a full disk here is the save's, not the optimizer's
      save(step + 1);
    }
    return Next::kStep;
  } catch (const std::exception& e) {
    if (!memory::is_out_of_memory(e)) rethrow_at_step(e, step, micro_at_, per_step, phase_);
    exit_code_ = out_of_memory(e, step, data_state_at_start, scheduler_state_at_start);
    return Next::kStop;
  }
}

// Out of memory: report while the step's tensors are still alive, then free
// them and save the last completed step.
int Trainer::out_of_memory(const std::exception& e, int64_t step, const std::string& data_state_at_start,
                           const std::string& scheduler_state_at_start) {
  progress_->finish();
  memory::OomEvent event;
  event.device = device_.str();
  event.step = step;
  event.phase = phase_.empty() ? "step" : phase_;
  event.error = first_line(e);
  event.figures = memory::memory_now(device_);
  event.plan = options_.memory_plan;
  event.groups = nameable_tensors(parameters_, *optimizer_, live_, run_.lm_head());
  const std::string report = memory::format_oom_report(event);
  std::cerr << report << std::flush;
  if (root()) {
    std::ofstream file(output_dir_ + "/oom_report.txt");
    file << report;
    metrics_file_->write({{"step", step}, {"out_of_memory", event.error}, {"phase", event.phase},
                          {"memory_current_bytes", event.figures.current_bytes}, {"memory_peak_bytes", event.figures.peak_bytes}});
  }
  // Drop every reference to the step's tensors before saving.
  live_ = MicroBatch{};
  event.groups.clear();
  optimizer_->zero_grad();
  std::string saved;
  if (updating_) {
    saved = "no emergency checkpoint: the update was half applied (the newest consistent state is " +
            (last_checkpoint_step_ >= 0 ? "checkpoint step " + std::to_string(last_checkpoint_step_) : std::string("the start")) + ")";
  } else if (step == last_checkpoint_step_ || step == 0) {
    saved = step == 0 ? "no steps completed, nothing to save"
                      : "the checkpoint of step " + std::to_string(step) + " already holds the last completed step";
  } else if (world_.world_size() > 1) {
    // The other ranks are not at a collective: nothing can be gathered.
    saved = "no emergency checkpoint with several ranks (the newest consistent state is " +
            (last_checkpoint_step_ >= 0 ? "checkpoint step " + std::to_string(last_checkpoint_step_) : std::string("the start")) + ")";
  } else {
    try {
      saved = "emergency checkpoint of the last completed step: " + save(step, data_state_at_start, scheduler_state_at_start);
    } catch (const std::exception& save_error) {
      saved = std::string("emergency checkpoint failed: ") + save_error.what();
    }
  }
  std::ostringstream summary;
  summary << "out of memory on " << device_.str() << " at step " << step << " (" << event.phase
          << "): " << memory::short_oom_message(event.error) << "; measured peak " << memory::format_bytes(event.figures.peak_bytes);
  if (options_.memory_plan) summary << " vs predicted " << memory::format_bytes(options_.memory_plan->peak_bytes);
  summary << "; " << saved << "; report in " << output_dir_ << "/oom_report.txt; `dflash-host plan` proposes settings that fit";
  log::error(summary.str());
  return kExitOutOfMemory;
}

int Trainer::train() {
  if (!make_feed_ && group_.world_size() > s_.grad_accumulation)
    throw std::invalid_argument("train.grad_accumulation is " + std::to_string(s_.grad_accumulation) +
                                " data-source batches per step over all ranks, fewer than the " +
                                std::to_string(group_.world_size()) + " ranks: a rank would have nothing to train on. "
                                "Set train.grad_accumulation to at least the world size (a multiple of it keeps the "
                                "ranks equally busy)");
  set_up();
  resume();
  if (first_step_ >= s_.steps) {
    log::info("the run already reached train.steps = " + std::to_string(s_.steps) + "; nothing to do");
    return 0;
  }
  set_up_evaluation();
  if (root()) {
    try {
      checkpoint::check_writable(checkpoint_root_);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(std::string(e.what()) + "; train.output_dir must be a folder this run can write "
                               "(nothing was trained)");
    }
    metrics_file_ = std::make_unique<metrics::MetricsFile>(output_dir_ + "/metrics.jsonl", first_step_);
    if (s_.tensorboard) event_file_ = std::make_unique<metrics::EventFile>(output_dir_, first_step_);
  }
  // Only rank 0 draws progress; the others' console lines are their logs.
  progress_ = std::make_unique<metrics::ConsoleProgress>(root() ? s_.progress : "quiet", first_step_, s_.steps, s_.log_every);
  int64_t parameter_count = 0;
  for (const auto& [name, tensor] : parameters_) parameter_count += tensor.numel();
  if (root())
    log::info("training " + std::to_string(parameter_count) + " drafter parameters on " + device_.str() +
              (group_.world_size() > 1 ? " × " + std::to_string(group_.world_size()) + " ranks" : std::string()) +
              " for steps " + std::to_string(first_step_) + "…" + std::to_string(s_.steps - 1) + "; target layers " +
              nlohmann::json(run_.drafter_facts().target_layer_ids).dump() + "; metrics in " + output_dir_ + "/metrics.jsonl");
  last_checkpoint_step_ = first_step_ > 0 ? first_step_ : -1;
  // Every micro-batch comes through the feed, and every data position from
  // it (colocated: the lookahead, where a batch fetched ahead is not yet consumed).
  feed_ = make_feed_ ? make_feed_(first_step_) : std::make_unique<ColocatedFeed>(run_, group_);
  const StopRequest stop_request;
  stop_request_ = &stop_request;
  int64_t step = first_step_;
  for (; step < s_.steps; ++step) {
    if (options_.stop_after > 0 && step - first_step_ >= options_.stop_after) break;
    // With several ranks every rank stops after the same step: the one at
    // which any of them saw the signal (the step's figures carry it).
    if (const int sig = group_.world_size() > 1 ? agreed_stop_signal_ : stop_request.signal()) {
      progress_->message(std::string(stop_signal_name(sig)) + ": stopping before step " + std::to_string(step) +
                         " with a checkpoint of the steps done; run the same command to resume");
      exit_code_ = kExitStoppedOnRequest;
      break;
    }
    const Next next = this->step(step);
    if (exit_code_ == kExitOutOfMemory) {
      feed_->finish();  // a target rank waiting for a grant hears "stop"
      return exit_code_;
    }
    if (next == Next::kEndAfter) ++step;
    if (next != Next::kStep) break;
  }
  progress_->finish();
  // A step already saved (--stop-after at a checkpoint_every step, or a
  // resumed run whose data had ended) is not written again.
  if ((exit_code_ == 0 || exit_code_ == kExitStoppedOnRequest) && step != last_checkpoint_step_) save(step);
  feed_->finish();
  stop_request_ = nullptr;
  // The target ranks of a disaggregated run wait for the end (rank 0 serves
  // the store every rank still uses).
  if (make_feed_) world_.barrier("the end of the run");
  if (root() && run_.has_data())
    if (auto facts = run_.data().describe()) log::info("data: " + facts->dump());
  return exit_code_;
}

}  // namespace

int run_training(Run& run, const RunOptions& options, const TrainingRanks& ranks) {
  Trainer trainer(run, options, ranks);
  return trainer.train();
}

int run_training(Run& run, const RunOptions& options, dist::Collective& group) {
  return run_training(run, options, TrainingRanks{group, group, {}});
}

int run_training(Run& run, const RunOptions& options) {
  const std::unique_ptr<dist::Collective> one = dist::single_process();
  return run_training(run, options, *one);
}

host::NamedTensors first_step_gradients(Run& run) {
  run.bind();
  std::optional<host::NamedTensors> batch = run.data().next_batch();
  if (!batch) throw std::runtime_error(run.data().record().label() + " yielded no batch");
  const host::NamedTensors parameters = run.drafter().parameters();
  for (const auto& [name, tensor] : parameters)
    if (tensor.grad().defined()) tensor.mutable_grad() = at::Tensor();
  MicroBatch mb;
  mb.batch = std::move(*batch);
  std::string phase;
  PhaseTimer untimed(false, c10::Device(run.settings().device));
  produce(run, mb, phase, untimed);
  draft_and_score(run, mb, 0, 0, phase, untimed);
  mb.out.loss.backward();
  host::NamedTensors grads;
  for (const auto& [name, tensor] : parameters)
    grads.emplace_back(name, tensor.grad().defined() ? tensor.grad().detach().clone() : at::zeros_like(tensor));
  return grads;
}

}  // namespace dflash::train
