// The ranks of a run and the few collectives the trainer needs, behind one
// small interface so that the trainer's translation units never include
// c10d: process_group.cpp implements it over c10d's ProcessGroupNCCL (CUDA
// tensors) and ProcessGroupGloo (CPU tensors) after a rendezvous at the run's store;
// single_process() is the world of one, where every collective is the
// identity and nothing is communicated.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::dist {

// A collective that failed or waited past train.collective_timeout_s: the
// message names the collective and the ranks that did not reach it (dead or
// hung), and says what to do.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective begun, not yet waited for.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual void wait() = 0;
};

// The group's key-value store (the rendezvous store), for small control
// messages between ranks: the pipeline's credits and stops. Each is its own
// connection: use it from one thread.
class KeyValue {
 public:
  virtual ~KeyValue() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::optional<std::string> get_if_set(const std::string& key) = 0;  // at once, without waiting
  virtual void erase(const std::string& key) = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  bool is_root() const { return rank() == 0; }

  // Σ over ranks, in place. Every rank passes a tensor of the same shape and
  // dtype, in the same order of calls; `what` names it in errors ("gradient
  // bucket 3 of step 12"). The async form returns at once.
  virtual std::unique_ptr<Pending> all_reduce_sum_async(at::Tensor tensor, const std::string& what) = 0;
  void all_reduce_sum(at::Tensor tensor, const std::string& what) { all_reduce_sum_async(std::move(tensor), what)->wait(); }
  // Rank r's `mine` lands in out[r]; every rank's `mine` has the same shape.
  virtual void all_gather(std::vector<at::Tensor>& out, const at::Tensor& mine, const std::string& what) = 0;
  // Rank `root`'s tensor, into every rank's, in place.
  virtual void broadcast(at::Tensor tensor, int root, const std::string& what) = 0;
  // Every rank's text (any length), in rank order.
  std::vector<std::string> all_gather_text(const std::string& mine, const std::string& what);
  virtual void barrier(const std::string& what) = 0;
  // This rank is failing (`reason`: its error): the other ranks' errors
  // quote it. Best effort; nothing on one process.
  virtual void announce_failure(const std::string& reason) { (void)reason; }

  // Point to point, for the pipeline's items (pipeline/item.h): this
  // rank's `tensor` to rank `to`; rank `from`'s into `tensor`, whose shape
  // and dtype must be the sender's. Messages between two ranks with one tag
  // arrive in the order sent; `tag` keeps channels apart. `what` names the
  // message in errors, which name the peer when it has died or hung. The
  // group's other operations may run on another thread meanwhile. One
  // process has no peer: both throw std::logic_error.
  virtual std::unique_ptr<Pending> send_async(at::Tensor tensor, int to, int tag, const std::string& what);
  virtual std::unique_ptr<Pending> recv_async(at::Tensor tensor, int from, int tag, const std::string& what);
  void send(at::Tensor tensor, int to, int tag, const std::string& what) { send_async(std::move(tensor), to, tag, what)->wait(); }
  void recv(at::Tensor tensor, int from, int tag, const std::string& what) { recv_async(std::move(tensor), from, tag, what)->wait(); }

  // The ranks `members` (ranks of this group, ascending, this rank among
  // them) as a group of their own, renumbered 0…n−1 in that order, with its
  // own collectives (the drafter ranks' gradient reduction). Called by the
  // members only, each once per `name`. Its errors name world ranks.
  virtual std::unique_ptr<Collective> subgroup(const std::vector<int>& members, const std::string& name);

  // A new connection to the group's store. One process has none: throws
  // std::logic_error.
  virtual std::unique_ptr<KeyValue> key_value();
};

// The store keys every rank's watch writes (process_group.cpp), for whoever
// must tell a live rank from a dead one: its heartbeat, "<beat> <collectives
// begun>" every second (`scope`: a subgroup's, "" for the world's), and the
// error it announced when it failed (by world rank).
std::string heartbeat_key(int rank, const std::string& scope = "");
std::string failure_key(int world_rank);

// How a c10d-backed group makes a subgroup (process_group.cpp).
using SubgroupMaker = std::function<std::unique_ptr<Collective>(const std::vector<int>& members, const std::string& name)>;
using KeyValueMaker = std::function<std::unique_ptr<KeyValue>()>;
// How a backend's group makes what belongs to its run beside it: a group of
// some of its members, and a client of the run's key-value store. Either
// may be empty (then Collective's defaults answer).
struct GroupMakers {
  SubgroupMaker subgroup;
  KeyValueMaker key_value;
};

// The world of one process: rank 0 of 1.
std::unique_ptr<Collective> single_process();

}  // namespace dflash::dist
