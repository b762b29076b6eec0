// Flow control between target ranks and drafter ranks. A drafter rank
// grants an element of its sequence (pipeline/topology.h) when it has a
// free slot for it; the target rank that owns the element sends it only
// once granted. So a drafter rank never holds more than train.queue_depth
// items, whatever the number of target ranks: the seed's 3-target OOM
// cannot happen by construction.
//
// Credits are small and their waits must never block the items: they are
// keys of the run's store, "dflash/pipe/<drafter rank>/<step>/<micro>" =
// "grant" or "stop", written by the drafter rank and read (then erased) by
// the target rank, which polls every drafter rank it serves in turn. A
// "stop" at a target's next element ends its work for that drafter rank.
#pragma once

#include "dist/collective.h"
#include "pipeline/topology.h"

#include <memory>
#include <optional>
#include <string>

namespace dflash::pipeline {

enum class Answer { kNone, kGrant, kStop };

class CreditBoard {
 public:
  explicit CreditBoard(std::unique_ptr<dist::KeyValue> store) : store_(std::move(store)) {}
  // Each throws dist::CollectiveError when the store is gone (rank 0 exited).
  void grant(int drafter_rank, const Element& e);
  void stop(int drafter_rank, const Element& e);
  // What drafter rank `drafter_rank` said about `e` so far; a said answer is
  // erased once read.
  Answer poll(int drafter_rank, const Element& e);
  // The error rank `rank` announced when it failed (dist::Collective::announce_failure).
  std::optional<std::string> failure_of(int rank);
  // Rank `rank`'s heartbeat as its watch last wrote it (dist/c10d_collective.h):
  // standing still for seconds means the rank died or is stopped.
  std::optional<std::string> heartbeat_of(int rank);

 private:
  static std::string key(int drafter_rank, const Element& e);
  std::unique_ptr<dist::KeyValue> store_;
};

}  // namespace dflash::pipeline
