// A drafter rank's side of the pipeline: it grants the elements of its
// sequence (pipeline/topology.h) as slots free up, receives them on a
// thread of its own in that order, and hands the items to the training
// loop. At most train.queue_depth items are held at any time — granted,
// in flight, queued or being trained on — so the memory items take on this
// rank is bounded by queue_depth × the item size, whatever the number of
// target ranks.
#pragma once

#include "dist/collective.h"
#include "pipeline/credits.h"
#include "pipeline/item.h"
#include "pipeline/topology.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace dflash::pipeline {

// What the inbox saw since the last take_figures().
struct InboxFigures {
  double wait_seconds = 0;  // the training loop waiting for an item (drafter stall)
  int64_t taken = 0;        // items handed out
  int64_t tokens = 0;       // their input_ids' tokens
  double held_sum = 0;      // Σ items held at each hand-out (mean occupancy = held_sum / taken)
  int64_t held_max = 0;     // most items held at once
  int64_t item_bytes_max = 0;
  std::map<int, nlohmann::json> targets;  // the newest figures each target rank sent, by world rank
};

class DrafterInbox {
 public:
  // `first_step`…`steps` − 1: the steps of this run; `device`: where the
  // features land.
  DrafterInbox(dist::Collective& world, const Topology& topology, int64_t first_step, int64_t steps, int64_t queue_depth,
               c10::Device device);
  ~DrafterInbox();
  DrafterInbox(const DrafterInbox&) = delete;
  DrafterInbox& operator=(const DrafterInbox&) = delete;

  // The item of (step, micro), this rank's next; nullopt when the data
  // ended before it. Rethrows the receiving thread's error.
  std::optional<Item> take(int64_t step, int64_t micro);
  // The item last taken is trained on: its slot is granted again.
  void release();
  // The data position after `step`'s batches (drafter rank 0 only), from
  // target rank 0; when the data ended, the position at the end.
  std::string data_state_after(int64_t step);
  // No more items wanted: stops granting, tells every target rank that
  // serves this one, receives what was already granted, and joins.
  void finish();
  InboxFigures take_figures();
  // The most items this rank ever held at once (tests assert ≤ queue_depth).
  int64_t most_held() const;

 private:
  // The next element to grant, in sequence order; false past the last step.
  bool next_to_grant(Element& e);
  void grant_what_fits();  // main thread
  void receive_loop();     // the receiving thread
  void wait_for(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready);

  dist::Collective& world_;
  const Topology topology_;
  const int rank_;
  const int64_t steps_, queue_depth_;
  const c10::Device device_;
  CreditBoard board_;

  // Main thread: the grant cursor.
  int64_t grant_step_;
  size_t grant_index_ = 0;
  std::vector<Element> grant_steps_elements_;
  int64_t held_ = 0;  // granted and not yet released (under mutex_)

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Element> granted_;  // granted, not yet received
  std::deque<Item> queue_;       // received items, in order
  std::map<int64_t, std::string> data_states_;
  std::optional<std::string> end_state_;
  bool ended_ = false, finishing_ = false, thread_done_ = false;
  std::exception_ptr error_;
  InboxFigures figures_;
  int64_t most_held_ = 0;
  std::thread thread_;
};

}  // namespace dflash::pipeline
