#include "pipeline/target_rank.h"

#include "log/log.h"
#include "memory/memory_plan.h"
#include "memory/memory_stats.h"
#include "memory/oom_report.h"
#include "pipeline/credits.h"
#include "pipeline/item.h"
#include "runtime/exit_codes.h"
#include "train/batch_lookahead.h"
#include "train/frozen_weights.h"
#include "train/resume.h"
#include "train/stages.h"
#include "train/stop_request.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

namespace dflash::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

class TargetRank {
 public:
  TargetRank(train::Run& run, const train::RunOptions& options, dist::Collective& world, const Topology& topology)
      : run_(run),
        options_(options),
        world_(world),
        topology_(topology),
        rank_(world.rank()),
        device_(run.settings().device),
        board_(world.key_value()),
        timer_(false, device_) {}

  int run();

 private:
  // The order of elements in a step: its micro-batches, then its end.
  int64_t order(const Element& e) const { return e.step * (topology_.global_batch() + 1) + (e.step_end() ? topology_.global_batch() : e.micro); }
  // This rank's elements of `step` for drafter rank `d`, in order.
  std::vector<Element> mine_for(int d, int64_t step) const;
  // Waits for drafter rank `d`'s word on `e`; the wait is the stall.
  Answer await(int d, const Element& e);
  // Fails when drafter rank `d` announced a failure or its heartbeat stood still.
  void check_alive(int d, Clock::time_point waiting_since);
  nlohmann::json figures() const;
  Item produce_item(host::NamedTensors batch, int64_t step, int64_t micro);
  Item end_item(ItemKind kind, int64_t step, int64_t micro);
  // The run is over for this rank (data ended, or a drafter rank said stop
  // at `from`): every later element a drafter rank grants is answered "no
  // item", until each has said stop or no element is left.
  void drain(const Element& from);

  train::Run& run_;
  const train::RunOptions& options_;
  dist::Collective& world_;
  const Topology topology_;
  const int rank_;
  const c10::Device device_;
  CreditBoard board_;
  train::PhaseTimer timer_;
  std::unique_ptr<train::BatchLookahead> batches_;
  int64_t first_step_ = 0, tokens_ = 0, items_ = 0;
  double stall_s_ = 0, forward_s_ = 0;
  Clock::time_point start_;
  std::map<int, std::pair<std::string, Clock::time_point>> heartbeats_;
  std::vector<int> stopped_by_;
  std::vector<std::unique_ptr<dist::Pending>> ends_in_flight_;
};

std::vector<Element> TargetRank::mine_for(int d, int64_t step) const {
  std::vector<Element> out;
  for (const Element& e : topology_.drafter_sequence(d, step))
    if (e.source == rank_) out.push_back(e);
  return out;
}

void TargetRank::check_alive(int d, Clock::time_point waiting_since) {
  if (const auto failure = board_.failure_of(d))
    throw dist::CollectiveError(describe_rank(topology_, rank_) + ": " + describe_rank(topology_, d) + " failed: " + *failure);
  const std::optional<std::string> beat = board_.heartbeat_of(d);
  auto& [last, seen] = heartbeats_[d];
  if (beat && *beat != last) {
    last = *beat;
    seen = Clock::now();
  } else if (since(seen) > 5 && since(waiting_since) > 5) {
    throw dist::CollectiveError(describe_rank(topology_, rank_) + ": " + describe_rank(topology_, d) +
                                " stopped responding (its heartbeat stood still for 5 s: it exited, was killed or is "
                                "stopped). The last checkpoint is intact; relaunch to resume from it");
  }
  if (since(waiting_since) > run_.settings().collective_timeout_s)
    throw dist::CollectiveError(describe_rank(topology_, rank_) + ": " + describe_rank(topology_, d) +
                                " granted no slot within train.collective_timeout_s (" +
                                std::to_string(run_.settings().collective_timeout_s) +
                                " s) although it is alive: is one of its steps slower than that?");
}

Answer TargetRank::await(int d, const Element& e) {
  const Clock::time_point start = Clock::now();
  Clock::time_point checked = start;
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    const Answer answer = board_.poll(d, e);
    if (answer != Answer::kNone) {
      stall_s_ += since(start);
      return answer;
    }
    if (since(checked) > 1) {
      check_alive(d, start);
      checked = Clock::now();
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

nlohmann::json TargetRank::figures() const {
  return {{"rank", rank_},
          {"tokens", tokens_},
          {"items", items_},
          {"stall_s", stall_s_},
          {"forward_s", forward_s_},
          {"wall_s", since(start_)},
          {"memory_peak_bytes", memory::memory_now(device_).peak_bytes}};
}

Item TargetRank::produce_item(host::NamedTensors batch, int64_t step, int64_t micro) {
  const Clock::time_point start = Clock::now();
  train::MicroBatch mb;
  mb.batch = std::move(batch);
  std::string phase;
  train::produce(run_, mb, phase, timer_);
  Item item;
  item.step = step;
  item.micro = micro;
  item.batch = std::move(mb.batch);
  item.features = std::move(mb.hidden);
  for (const auto& [name, t] : item.features)
    if (!host::same_device(t.device(), device_))
      throw std::invalid_argument(run_.target().record().label() + ": its output '" + name + "' is on " + t.device().str() +
                                  ", not on this target rank's device " + device_.str());
  forward_s_ += since(start);
  tokens_ += host::require_tensor(item.batch, "input_ids", "the data source").numel();
  ++items_;
  return item;
}

Item TargetRank::end_item(ItemKind kind, int64_t step, int64_t micro) {
  Item item;
  item.kind = kind;
  item.step = step;
  item.micro = micro;
  item.meta["data_state"] = batches_->position();
  item.meta["figures"] = figures();
  return item;
}

void TargetRank::drain(const Element& from) {
  struct Cursor {
    int drafter;
    int64_t step;
    std::vector<Element> pending;
    bool done = false;
  };
  std::vector<Cursor> cursors;
  for (int d : topology_.drafters_fed_by(rank_)) {
    if (from.step >= run_.settings().steps) break;  // every element was answered
    if (std::find(stopped_by_.begin(), stopped_by_.end(), d) != stopped_by_.end()) continue;
    Cursor c{d, from.step, {}};
    for (const Element& e : mine_for(d, from.step))
      if (order(e) >= order(from)) c.pending.push_back(e);
    cursors.push_back(std::move(c));
  }
  const Clock::time_point start = Clock::now();
  Clock::time_point checked = start;
  for (;;) {
    bool open = false, moved = false;
    for (Cursor& c : cursors) {
      while (!c.done && c.pending.empty()) {
        if (++c.step >= run_.settings().steps) c.done = true;
        else c.pending = mine_for(c.drafter, c.step);
      }
      if (c.done) continue;
      open = true;
      const Element e = c.pending.front();
      const Answer answer = board_.poll(c.drafter, e);
      if (answer == Answer::kStop) {
        c.done = true;
      } else if (answer == Answer::kGrant) {
        // Begun, not waited for: the drafter rank receives its elements in
        // its own order, and this rank must not block on one while another
        // drafter rank waits for its answer.
        send_item(world_, c.drafter, end_item(ItemKind::kEnd, e.step, e.micro), &ends_in_flight_);
        c.pending.erase(c.pending.begin());
      }
      moved = moved || answer != Answer::kNone;
    }
    if (!open) break;
    if (since(checked) > 1) {
      for (const Cursor& c : cursors)
        if (!c.done) check_alive(c.drafter, start);
      checked = Clock::now();
    }
    if (!moved) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& pending : ends_in_flight_) pending->wait();
  ends_in_flight_.clear();
}

int TargetRank::run() {
  // SIGTERM and SIGINT are the drafter ranks' to act on (they checkpoint and
  // then say stop): this rank keeps serving until then.
  const train::StopRequest ignored_here;
  const train::TrainSettings& s = run_.settings();
  const std::string checkpoint_root = s.output_dir + "/checkpoints";
  if (const auto saved = train::load_resume_checkpoint(world_, checkpoint_root, options_.resume_from)) {
    train::check_resume_changes(train::resume_changes(saved->trainer_state, run_.resolved_config(), run_.plugin_identities()),
                                saved->dir, options_.allow_config_change);
    const train::ResumeState state = train::read_trainer_state(*saved);
    first_step_ = state.step;
    run_.data().load_state(state.data_state);
  }
  batches_ = std::make_unique<train::BatchLookahead>(run_.data(), s.prefetch);
  start_ = Clock::now();
  const int64_t per_step = topology_.global_batch();
  const int first_drafter = topology_.target_ranks();
  Element stopped_at{s.steps, 0, rank_};
  bool logged_size = false;
  for (int64_t step = first_step_; step < s.steps; ++step) {
    bool over = false;
    for (int64_t micro = 0; micro < per_step; ++micro) {
      std::optional<host::NamedTensors> batch = batches_->next();
      if (!batch) {
        stopped_at = {step, micro, rank_};
        over = true;
        break;
      }
      if (topology_.target_of(micro) != rank_) continue;
      Item item = produce_item(std::move(*batch), step, micro);
      const int d = topology_.drafter_of(micro);
      if (await(d, {step, micro, rank_}) == Answer::kStop) {
        stopped_by_.push_back(d);
        stopped_at = {step, micro, rank_};
        over = true;
        break;
      }
      item.meta["figures"] = figures();
      if (!logged_size) {
        log::info("hidden-state item: " + memory::format_bytes(item_bytes(item)) + " (" +
                  std::to_string(item.batch.size() + item.features.size()) + " tensors) per micro-batch");
        logged_size = true;
      }
      send_item(world_, d, item);
    }
    if (over) break;
    if (rank_ == 0) {
      const Element end{step, -1, 0};
      if (await(first_drafter, end) == Answer::kStop) {
        stopped_by_.push_back(first_drafter);
        stopped_at = end;
        break;
      }
      send_item(world_, first_drafter, end_item(ItemKind::kStepEnd, step, -1));
    }
  }
  drain(stopped_at);
  batches_->settle();
  world_.barrier("the end of the run");
  log::info(describe_rank(topology_, rank_) + ": " + std::to_string(items_) + " items, " + std::to_string(tokens_) +
            " tokens; waited " + std::to_string(static_cast<int>(100 * stall_s_ / std::max(1e-9, since(start_)))) +
            " % of the time for drafter ranks to free a slot");
  return 0;
}

}  // namespace

int run_target_rank(train::Run& run, const train::RunOptions& options, dist::Collective& world, const Topology& topology) {
  TargetRank rank(run, options, world, topology);
  try {
    return rank.run();
  } catch (const std::exception& e) {
    if (!memory::is_out_of_memory(e)) throw;
    // Nothing of the drafter's lives here: the target rank's plan is the one to compare.
    const c10::Device device(run.settings().device);
    std::string line = describe_rank(topology, world.rank()) + ": out of memory on " + device.str() + ": " +
                       memory::short_oom_message(e.what()) + "; measured peak " +
                       memory::format_bytes(memory::memory_now(device).peak_bytes);
    if (options.memory_plan) line += " vs predicted " + memory::format_bytes(options.memory_plan->peak_bytes) + " (the target rank's plan)";
    log::error(line + "; the drafter ranks' last checkpoint is intact. `dflash-host plan` shows each role's memory; a "
               "smaller data token budget (--tokens-per-batch) shrinks the target's forward and its items");
    world.announce_failure(line);
    return kExitOutOfMemory;
  }
}

}  // namespace dflash::pipeline
