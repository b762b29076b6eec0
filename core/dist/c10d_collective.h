// Internal to core/dist: the Collective over a c10d process group (any
// backend class: ProcessGroupGloo, ProcessGroupNCCL), and what a failed
// collective is told about the ranks that did not take part in it. Only the
// backends' translation units include this (it pulls in c10d's headers).
#pragma once

#include "dist/collective.h"
#include "dist/process_group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dflash::dist::detail {

// Every rank writes "dflash/heartbeat/<rank>" = "<beat> <collectives begun>"
// to the store every second from a thread of its own (with its own store
// client). A collective that fails reads them: a rank whose heartbeat stands
// still has died or been stopped; one whose count lags is alive but did not
// reach the collective.
//
// A subgroup has a watch of its own (`scope` keeps its keys apart); its
// messages name world ranks (`world_ranks[r]` for its rank r).
class Watch {
 public:
  // `beats`: the heartbeat thread's own client; `store`: the diagnosis's
  // and announcements' (so that a diagnosis never waits behind a heartbeat
  // stuck on a stalled store).
  Watch(c10::intrusive_ptr<c10d::Store> beats, c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
        std::string store_address,
        std::string scope = "", std::vector<int> world_ranks = {});
  ~Watch();
  void begun() { ++collectives_; }
  int64_t collectives() const { return collectives_; }
  // A rank that fails says why, for the others' messages.
  void announce_failure(const std::string& reason);
  // The error to throw for collective `what` failing with `error` here.
  // `peer`: a point-to-point message with that rank (of this group), the
  // only one examined; its collective count says nothing then.
  std::string diagnose(const std::string& what, const std::string& error, std::optional<int> peer = std::nullopt);

 private:
  void beat_loop();
  std::string failed_key(int rank) const;
  std::string name(int rank) const;
  c10::intrusive_ptr<c10d::Store> beats_, store_;
  const int rank_, world_size_;
  const std::string store_address_, scope_;
  const std::vector<int> world_ranks_;
  std::atomic<int64_t> collectives_{0};
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

// What a backend needs from the rest: where CUDA tensors go for NCCL (CPU
// tensors are copied there and back), and the watch.
template <class Group>
class C10dCollective final : public Collective {
 public:
  // `close`: what ends the group cleanly (NCCL's shutdown), before the watch stops.
  // `makers`: how this group's members make a group of their own, and store clients.
  C10dCollective(c10::intrusive_ptr<Group> group, int rank, int world_size, std::optional<c10::Device> staging,
                 std::unique_ptr<Watch> watch, std::function<void(Group&)> close = {}, GroupMakers makers = {})
      : group_(std::move(group)), rank_(rank), world_size_(world_size), staging_(staging), watch_(std::move(watch)),
        close_(std::move(close)), makers_(std::move(makers)) {}
  ~C10dCollective() override {
    try {
      if (close_) close_(*group_);
    } catch (const std::exception&) {
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  std::unique_ptr<Pending> all_reduce_sum_async(at::Tensor tensor, const std::string& what) override {
    struct Running final : Pending {
      C10dCollective* self;
      std::string what;
      at::Tensor user, staged;
      std::vector<at::Tensor> tensors;
      decltype(std::declval<Group&>().allreduce(std::declval<std::vector<at::Tensor>&>())) work;
      void wait() override {
        self->guarded(what, [&] { work->wait(); });
        if (staged.defined() && !staged.is_same(user)) user.copy_(staged);
      }
    };
    auto r = std::make_unique<Running>();
    r->self = this;
    r->what = what;
    r->user = tensor;
    r->staged = stage(tensor);
    r->tensors = {r->staged};
    watch_->begun();
    guarded(what, [&] { r->work = group_->allreduce(r->tensors, c10d::AllreduceOptions()); });
    return r;
  }

  void all_gather(std::vector<at::Tensor>& out, const at::Tensor& mine, const std::string& what) override {
    at::Tensor in = stage(mine.contiguous());
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int r = 0; r < world_size_; ++r) gathered[0].push_back(at::empty_like(in));
    std::vector<at::Tensor> inputs{in};
    watch_->begun();
    guarded(what, [&] { group_->allgather(gathered, inputs)->wait(); });
    out.clear();
    for (const at::Tensor& t : gathered[0]) out.push_back(t.to(mine.device()));
  }

  void broadcast(at::Tensor tensor, int root, const std::string& what) override {
    at::Tensor staged = stage(tensor);
    std::vector<at::Tensor> tensors{staged};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    watch_->begun();
    guarded(what, [&] { group_->broadcast(tensors, options)->wait(); });
    if (!staged.is_same(tensor)) tensor.copy_(staged);
  }

  // An all-reduce of one number: the same call on every backend (NCCL's
  // barrier guesses a device).
  void barrier(const std::string& what) override { all_reduce_sum(at::zeros({1}, at::kFloat), what); }

  void announce_failure(const std::string& reason) override { watch_->announce_failure(reason); }

  std::unique_ptr<Pending> send_async(at::Tensor tensor, int to, int tag, const std::string& what) override {
    auto r = std::make_unique<PointToPoint>(this, what, to);
    r->tensors = {stage(tensor.contiguous())};
    guarded(what, [&] { r->work = group_->send(r->tensors, to, tag); }, to);
    return r;
  }

  std::unique_ptr<Pending> recv_async(at::Tensor tensor, int from, int tag, const std::string& what) override {
    auto r = std::make_unique<PointToPoint>(this, what, from);
    r->user = tensor;
    r->tensors = {stage(tensor)};
    guarded(what, [&] { r->work = group_->recv(r->tensors, from, tag); }, from);
    return r;
  }

  std::unique_ptr<Collective> subgroup(const std::vector<int>& members, const std::string& name) override {
    if (!makers_.subgroup) return Collective::subgroup(members, name);
    return makers_.subgroup(members, name);
  }

  std::unique_ptr<KeyValue> key_value() override {
    if (!makers_.key_value) return Collective::key_value();
    return makers_.key_value();
  }

 private:
  // A send or a receive: its errors name the peer. A received tensor that
  // was staged on the device comes back to the caller's.
  struct PointToPoint final : Pending {
    PointToPoint(C10dCollective* s, std::string w, int p) : self(s), what(std::move(w)), peer(p) {}
    C10dCollective* self;
    std::string what;
    int peer;
    at::Tensor user;
    std::vector<at::Tensor> tensors;
    c10::intrusive_ptr<c10d::Work> work;
    void wait() override {
      self->guarded(what, [&] { work->wait(); }, peer);
      if (user.defined() && !tensors[0].is_same(user)) user.copy_(tensors[0]);
    }
  };

  at::Tensor stage(const at::Tensor& t) const {
    if (!staging_ || t.device() == *staging_) return t;
    return t.to(*staging_);
  }
  template <class F>
  void guarded(const std::string& what, F&& f, std::optional<int> peer = std::nullopt) {
    try {
      f();
    } catch (const std::exception& e) {
      throw CollectiveError(watch_->diagnose(what, e.what(), peer));
    }
  }

  c10::intrusive_ptr<Group> group_;
  int rank_, world_size_;
  std::optional<c10::Device> staging_;
  std::unique_ptr<Watch> watch_;
  std::function<void(Group&)> close_;
  GroupMakers makers_;
};

}  // namespace dflash::dist::detail

namespace dflash::dist::detail {

// The NCCL process group (nccl_group.cpp, in CUDA builds only).
bool nccl_available();
// `rank` of `world_size` on `store` (a prefix of its own per group).
std::unique_ptr<Collective> join_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                                      const c10::Device& device, std::chrono::milliseconds timeout,
                                      std::unique_ptr<Watch> watch, GroupMakers makers);

}  // namespace dflash::dist::detail
