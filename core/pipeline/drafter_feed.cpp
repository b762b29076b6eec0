#include "pipeline/drafter_feed.h"

#include "memory/memory_stats.h"
#include "pipeline/drafter_inbox.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <sstream>

namespace dflash::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

std::string percent(double fraction) { return std::to_string(static_cast<int>(std::lround(100 * fraction))) + " %"; }

// The target ranks' cumulative figures, as each sends them with its items.
constexpr int kTargetFields = 6;  // tokens, items, stall_s, forward_s, wall_s, memory_peak_bytes
const char* const kTargetKeys[kTargetFields] = {"tokens", "items", "stall_s", "forward_s", "wall_s", "memory_peak_bytes"};
// A drafter rank's figures of one step.
// wait_s, wall_s, taken, tokens, held_sum, held_max, memory_peak_bytes, most held ever

class DrafterFeed final : public train::MicroBatchFeed {
 public:
  DrafterFeed(dist::Collective& world, const Topology& topology, const train::TrainSettings& s, int64_t first_step)
      : topology_(topology),
        rank_(world.rank()),
        device_(s.device),
        queue_depth_(s.queue_depth),
        log_every_(s.log_every),
        inbox_(std::make_unique<DrafterInbox>(world, topology, first_step, s.steps, s.queue_depth, c10::Device(s.device))),
        last_(Clock::now()),
        previous_(static_cast<size_t>(topology.target_ranks()), std::vector<double>(kTargetFields, 0.0)) {}

  Got next(int64_t step, int64_t micro, train::MicroBatch& mb, std::string& phase, train::PhaseTimer& timer) override {
    if (topology_.drafter_of(micro) != rank_) return Got::kOthers;
    phase = "waiting for the target ranks' item";
    std::optional<Item> item = inbox_->take(step, micro);
    timer.end("waiting for data");
    if (!item) return Got::kEnded;
    mb.batch = std::move(item->batch);
    mb.hidden = std::move(item->features);
    return Got::kMine;
  }
  void done() override { inbox_->release(); }
  std::string position_after(int64_t step) override { return inbox_->data_state_after(step); }
  void finish() override { inbox_->finish(); }
  nlohmann::json step_figures(dist::Collective& trainers, int64_t step) override;

 private:
  const Topology topology_;
  const int rank_;
  const c10::Device device_;
  const int64_t queue_depth_, log_every_;
  std::unique_ptr<DrafterInbox> inbox_;
  Clock::time_point last_;
  std::vector<std::vector<double>> previous_;  // each target rank's figures at the last step
  // Over the console's interval: Σ stall and Σ wall of each side.
  double target_stall_ = 0, target_wall_ = 0, drafter_wait_ = 0, drafter_wall_ = 0;
};

nlohmann::json DrafterFeed::step_figures(dist::Collective& trainers, int64_t step) {
  const InboxFigures mine = inbox_->take_figures();
  const Clock::time_point now = Clock::now();
  const double wall = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  const int T = topology_.target_ranks(), D = topology_.drafter_ranks();
  // Every drafter rank's step, and what each heard from the target ranks
  // (-1: nothing yet); gathered to all, read on the first.
  at::Tensor own = at::tensor({mine.wait_seconds, wall, static_cast<double>(mine.taken), static_cast<double>(mine.tokens),
                               mine.held_sum, static_cast<double>(mine.held_max),
                               static_cast<double>(memory::memory_now(device_).peak_bytes),
                               static_cast<double>(inbox_->most_held())},
                              at::kDouble);
  at::Tensor heard = at::full({T, kTargetFields}, -1.0, at::kDouble);
  for (const auto& [rank, figures] : mine.targets)
    for (int k = 0; k < kTargetFields; ++k)
      if (figures.contains(kTargetKeys[k])) heard[rank][k] = figures.at(kTargetKeys[k]).get<double>();
  std::vector<at::Tensor> drafters, targets;
  trainers.all_gather(drafters, own, "the pipeline's drafter figures");
  trainers.all_gather(targets, heard, "the pipeline's target figures");
  if (!trainers.is_root()) return nullptr;
  at::Tensor newest = targets[0].clone();
  for (size_t i = 1; i < targets.size(); ++i) newest = at::maximum(newest, targets[i]);  // cumulative: the largest is the newest

  nlohmann::json out = {{"target_ranks", T}, {"drafter_ranks", D}, {"queue_depth", queue_depth_},
                        {"item_bytes", mine.item_bytes_max}};
  nlohmann::json target_list = nlohmann::json::array(), drafter_list = nlohmann::json::array();
  double produced = 0, step_target_stall = 0, step_target_wall = 0;
  for (int t = 0; t < T; ++t) {
    std::vector<double> now_t(kTargetFields);
    for (int k = 0; k < kTargetFields; ++k) now_t[k] = newest[t][k].item<double>();
    if (now_t[0] < 0) {
      target_list.push_back({{"rank", t}, {"reported", false}});
      continue;
    }
    std::vector<double>& before = previous_[static_cast<size_t>(t)];
    const double dwall = now_t[4] - before[4], dstall = now_t[2] - before[2], dtokens = now_t[0] - before[0];
    const double rate = dwall > 0 ? dtokens / dwall : 0.0, stall = dwall > 0 ? dstall / dwall : 0.0;
    produced += rate;
    step_target_stall += std::max(0.0, dstall);
    step_target_wall += std::max(0.0, dwall);
    target_list.push_back({{"rank", t}, {"tokens_per_s", rate}, {"stall_fraction", stall},
                           {"memory_peak_bytes", static_cast<int64_t>(now_t[5])}});
    before = now_t;
  }
  double consumed = 0, held_sum = 0, taken = 0, held_max = 0, step_drafter_wait = 0, step_drafter_wall = 0;
  for (int d = 0; d < D; ++d) {
    const at::Tensor f = drafters[static_cast<size_t>(d)].to(at::kCPU);
    const double* q = f.data_ptr<double>();
    consumed += q[1] > 0 ? q[3] / q[1] : 0.0;
    held_sum += q[4];
    taken += q[2];
    held_max = std::max(held_max, q[5]);
    step_drafter_wait += q[0];
    step_drafter_wall += q[1];
    drafter_list.push_back({{"rank", T + d}, {"tokens_per_s", q[1] > 0 ? q[3] / q[1] : 0.0},
                            {"stall_fraction", q[1] > 0 ? q[0] / q[1] : 0.0}, {"queue_mean", q[2] > 0 ? q[4] / q[2] : 0.0},
                            {"queue_max", static_cast<int64_t>(q[5])}, {"queue_most_held", static_cast<int64_t>(q[7])},
                            {"memory_peak_bytes", static_cast<int64_t>(q[6])}});
  }
  out["targets"] = target_list;
  out["drafters"] = drafter_list;
  out["produced_tokens_per_s"] = produced;
  out["consumed_tokens_per_s"] = consumed;
  out["target_stall_fraction"] = step_target_wall > 0 ? step_target_stall / step_target_wall : 0.0;
  out["drafter_stall_fraction"] = step_drafter_wall > 0 ? step_drafter_wait / step_drafter_wall : 0.0;
  out["queue_mean"] = taken > 0 ? held_sum / taken : 0.0;
  out["queue_max"] = static_cast<int64_t>(held_max);
  target_stall_ += step_target_stall;
  target_wall_ += step_target_wall;
  drafter_wait_ += step_drafter_wait;
  drafter_wall_ += step_drafter_wall;
  if ((step + 1) % log_every_ == 0) {
    std::string bound;
    out["advice"] = pipeline_advice(topology_, target_wall_ > 0 ? target_stall_ / target_wall_ : 0.0,
                                    drafter_wall_ > 0 ? drafter_wait_ / drafter_wall_ : 0.0, bound);
    out["bound"] = bound;
    target_stall_ = target_wall_ = drafter_wait_ = drafter_wall_ = 0;
  }
  return out;
}

}  // namespace

std::unique_ptr<train::MicroBatchFeed> make_drafter_feed(dist::Collective& world, const Topology& topology,
                                                         const train::TrainSettings& settings, int64_t first_step) {
  return std::make_unique<DrafterFeed>(world, topology, settings, first_step);
}

std::string pipeline_advice(const Topology& topology, double target_stall, double drafter_stall, std::string& bound) {
  const int T = topology.target_ranks(), D = topology.drafter_ranks();
  std::ostringstream line;
  // A side that waits for the other more than a tenth of the time, and more
  // than the other waits, is bounded by the other.
  if (drafter_stall > 0.1 && drafter_stall > target_stall) {
    bound = "target";
    line << "pipeline target-bound: drafter ranks waited " << percent(drafter_stall) << " of the time for data, target ranks "
         << percent(target_stall) << " for a free slot — ";
    if (D > 1) line << "more target ranks (try --target-ranks " << T + 1 << " --drafter-ranks " << D - 1 << ")";
    else line << "more target ranks (more GPUs on the target side)";
    line << " or a smaller drafter token budget";
  } else if (target_stall > 0.1 && target_stall > drafter_stall) {
    bound = "drafter";
    line << "pipeline drafter-bound: target ranks waited " << percent(target_stall) << " of the time for a free slot, drafter ranks "
         << percent(drafter_stall) << " for data — ";
    if (T > 1) line << "more drafter ranks (try --target-ranks " << T - 1 << " --drafter-ranks " << D + 1 << ")";
    else line << "more drafter ranks (more GPUs on the drafter side)";
    line << ", or a deeper train.queue_depth if the waits come in bursts";
  } else {
    bound = "balanced";
    line << "pipeline balanced: target ranks waited " << percent(target_stall) << " of the time for a free slot, drafter ranks "
         << percent(drafter_stall) << " for data";
  }
  return line.str();
}

}  // namespace dflash::pipeline
