// The data source's next batch, fetched on a worker thread while the current
// step runs. Without it the host parses and packs each batch between steps,
// after the step's last host read, while the device waits: 8.7 ms of a 93 ms
// step in the GPU demo (docs/quality.md, run 6).
//
// The data source is called one call at a time and in the same order as
// without lookahead (its position, then a batch), so the batches, and the
// positions a checkpoint records, are the same: training stays bitwise
// unchanged and resumes exactly. train.prefetch = false fetches on the
// calling thread instead.
#pragma once

#include "plugin/instances.h"

#include <exception>
#include <future>
#include <optional>
#include <string>

namespace dflash::train {

class BatchLookahead {
 public:
  BatchLookahead(const host::DataSourceInstance& data, bool prefetch);
  ~BatchLookahead();  // waits for a fetch in flight
  BatchLookahead(const BatchLookahead&) = delete;
  BatchLookahead& operator=(const BatchLookahead&) = delete;

  // The next batch (nullopt once the data has ended), and, when prefetching,
  // the fetch of the one after begins. A data source's error surfaces here,
  // on the calling thread, for the batch it failed to make.
  std::optional<host::NamedTensors> next();
  // The data position after every batch next() has handed out: what a
  // checkpoint records. Waits for a fetch in flight.
  std::string position();
  // Waits for a fetch in flight, so that the caller may call the data source
  // itself (its describe(), say).
  void settle();

 private:
  struct Fetched {
    std::string position_before;  // the data source's save_state() just before this batch
    std::optional<host::NamedTensors> batch;
    std::exception_ptr error;  // next_batch() threw: rethrown by next()
  };
  Fetched fetch() const;

  const host::DataSourceInstance& data_;
  const bool prefetch_;
  std::future<Fetched> in_flight_;
  std::optional<Fetched> ready_;  // fetched ahead, not yet handed out
};

}  // namespace dflash::train
