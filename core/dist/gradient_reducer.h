// Gradients averaged across the ranks of a data-parallel run: flattened into
// buckets (in the reduction dtype), each bucket summed across ranks with one
// all-reduce. The buckets are reduced while the backward still runs: a hook
// on every parameter copies its final gradient into its bucket as autograd
// produces it, and a bucket whose gradients are all in starts its
// all-reduce at once — in bucket order, so that every rank issues the same
// collectives in the same order whatever order its hooks fire in. The
// parameters are bucketed in reverse order, the order a backward usually
// produces them. docs/distributed.md says what overlaps.
#pragma once

#include "dist/collective.h"
#include "plugin/host_api.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace dflash::dist {

class GradientReducer {
 public:
  // `reduce_dtype`: fp32 under fp32_master, the parameters' dtype otherwise.
  GradientReducer(const host::NamedTensors& parameters, Collective& group, c10::ScalarType reduce_dtype,
                  int64_t bucket_bytes = int64_t{25} << 20);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // The next backward is the rank's last of the step: its hooks fill the
  // buckets and start their reductions. `step` names the collectives.
  void arm(int64_t step);
  // After that backward: starts the buckets no hook completed (parameters
  // without a gradient this step count as zeros), waits for every bucket and
  // writes the sums back into the parameters' .grad.
  void finish();
  bool armed() const { return armed_; }
  size_t bucket_count() const { return buckets_.size(); }

 private:
  struct Slot {
    size_t parameter = 0;
    int64_t offset = 0, numel = 0;
  };
  struct Bucket {
    std::vector<Slot> slots;
    at::Tensor flat;
    size_t filled = 0;
    std::unique_ptr<Pending> pending;
  };
  void on_gradient(size_t parameter, const at::Tensor& incoming);
  void launch_ready();  // under mutex_
  void launch(size_t bucket);

  std::vector<at::Tensor> parameters_;
  std::vector<std::pair<size_t, size_t>> where_;  // parameter → (bucket, slot)
  std::vector<unsigned> hook_ids_;
  std::vector<bool> seen_;     // in its bucket this step
  std::vector<bool> touched_;  // a hook brought a gradient this step
  at::Tensor has_gradient_;    // [P]: 1 where this rank has a gradient, then summed over ranks
  std::vector<Bucket> buckets_;
  Collective& group_;
  std::mutex mutex_;
  bool armed_ = false;
  size_t next_launch_ = 0;
  int64_t step_ = 0;
};

}  // namespace dflash::dist
