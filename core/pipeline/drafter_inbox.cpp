#include "pipeline/drafter_inbox.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace dflash::pipeline {
namespace {

std::string element_name(const Element& e) {
  return e.step_end() ? "the data position after step " + std::to_string(e.step)
                      : "the item of step " + std::to_string(e.step) + ", micro-batch " + std::to_string(e.micro);
}

}  // namespace

DrafterInbox::DrafterInbox(dist::Collective& world, const Topology& topology, int64_t first_step, int64_t steps,
                           int64_t queue_depth, c10::Device device)
    : world_(world),
      topology_(topology),
      rank_(world.rank()),
      steps_(steps),
      queue_depth_(queue_depth),
      device_(device),
      board_(world.key_value()),
      grant_step_(first_step) {
  if (first_step < steps_) grant_steps_elements_ = topology_.drafter_sequence(rank_, first_step);
  thread_ = std::thread([this] { receive_loop(); });
  grant_what_fits();
}

DrafterInbox::~DrafterInbox() {
  try {
    finish();
  } catch (const std::exception&) {
  }
}

bool DrafterInbox::next_to_grant(Element& e) {
  while (grant_index_ >= grant_steps_elements_.size()) {
    if (grant_step_ + 1 >= steps_) return false;
    ++grant_step_;
    grant_steps_elements_ = topology_.drafter_sequence(rank_, grant_step_);
    grant_index_ = 0;
  }
  e = grant_steps_elements_[grant_index_];
  return true;
}

void DrafterInbox::grant_what_fits() {
  for (;;) {
    Element e;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (ended_ || finishing_ || error_) return;
    }
    if (!next_to_grant(e)) return;
    {
      // A step's end carries a position, not an item: it takes no slot.
      std::lock_guard<std::mutex> lock(mutex_);
      if (!e.step_end()) {
        if (held_ >= queue_depth_) return;
        ++held_;
        most_held_ = std::max(most_held_, held_);
      }
    }
    board_.grant(rank_, e);
    ++grant_index_;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      granted_.push_back(e);
    }
    changed_.notify_all();
  }
}

void DrafterInbox::receive_loop() {
  // On a GPU the items arrive on a stream of this thread's own, never the
  // training loop's: waiting for the next item must not queue the step's
  // kernels behind it. Each item is complete (its stream synchronized)
  // before the loop gets it.
  const c10::DeviceGuard device_guard(device_);
  std::optional<c10::StreamGuard> stream_guard;
  std::optional<c10::Stream> stream;
  if (device_.is_cuda()) {
    stream = c10::impl::getDeviceGuardImpl(device_.type())->getStreamFromGlobalPool(device_);
    stream_guard.emplace(*stream);
  }
  try {
    for (;;) {
      Element e;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return !granted_.empty() || finishing_; });
        if (granted_.empty()) break;
        e = granted_.front();
      }
      Item item = receive_item(world_, e.source, device_, element_name(e) + " from " + describe_rank(topology_, e.source));
      if (stream) c10::impl::getDeviceGuardImpl(device_.type())->synchronizeStream(*stream);
      std::lock_guard<std::mutex> lock(mutex_);
      granted_.pop_front();
      if (item.meta.contains("figures")) figures_.targets[e.source] = item.meta["figures"];
      if (item.kind == ItemKind::kEnd) {
        ended_ = true;
        if (!end_state_ && item.meta.contains("data_state")) end_state_ = item.meta["data_state"].get<std::string>();
      } else if (item.step != e.step || item.micro != e.micro || (item.kind == ItemKind::kStepEnd) != e.step_end()) {
        throw std::runtime_error(describe_rank(topology_, e.source) + " sent step " + std::to_string(item.step) +
                                 ", micro-batch " + std::to_string(item.micro) + " where " + element_name(e) +
                                 " was due: the ranks disagree on the run's layout (are they the same dflash-host, "
                                 "with the same train.topology and grad_accumulation?)");
      } else if (item.kind == ItemKind::kStepEnd) {
        data_states_[item.step] = item.meta.at("data_state").get<std::string>();
      } else if (!ended_ && !finishing_) {
        figures_.item_bytes_max = std::max(figures_.item_bytes_max, item_bytes(item));
        queue_.push_back(std::move(item));
      }
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    thread_done_ = true;
  }
  changed_.notify_all();
}

void DrafterInbox::wait_for(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready) {
  changed_.wait(lock, [&] { return ready() || error_ || thread_done_; });
}

std::optional<Item> DrafterInbox::take(int64_t step, int64_t micro) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for(lock, [&] { return !queue_.empty() || ended_; });
  figures_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!queue_.empty()) {
    Item item = std::move(queue_.front());
    queue_.pop_front();
    // Its memory came from the receiving stream; the training loop's stream
    // uses it now, so it is not reused before that stream is done with it.
    if (device_.is_cuda()) {
      const c10::Stream current = c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_);
      for (const auto& [name, t] : item.features)
        if (t.is_cuda()) t.record_stream(current);
    }
    if (item.step != step || item.micro != micro)
      throw std::logic_error("the inbox holds step " + std::to_string(item.step) + ", micro-batch " +
                             std::to_string(item.micro) + " where the trainer wants step " + std::to_string(step) +
                             ", micro-batch " + std::to_string(micro));
    ++figures_.taken;
    for (const auto& [name, t] : item.batch)
      if (name == "input_ids") figures_.tokens += t.numel();
    figures_.held_sum += static_cast<double>(held_);
    figures_.held_max = std::max(figures_.held_max, held_);
    return item;
  }
  if (error_) std::rethrow_exception(error_);
  if (ended_) return std::nullopt;
  throw std::logic_error("the pipeline's receiving thread ended before step " + std::to_string(step) + ", micro-batch " +
                         std::to_string(micro));
}

void DrafterInbox::release() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --held_;
  }
  grant_what_fits();
}

std::string DrafterInbox::data_state_after(int64_t step) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for(lock, [&] { return data_states_.count(step) > 0 || end_state_.has_value(); });
  if (const auto it = data_states_.find(step); it != data_states_.end()) {
    const std::string state = it->second;
    data_states_.erase(data_states_.begin(), it);  // older positions are never asked for again
    return state;
  }
  if (end_state_) return *end_state_;
  if (error_) std::rethrow_exception(error_);
  throw std::logic_error("no data position for step " + std::to_string(step) + " reached drafter rank " +
                         std::to_string(rank_ - topology_.target_ranks()));
}

void DrafterInbox::finish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finishing_ && !thread_.joinable()) return;
    finishing_ = true;
  }
  // Every target rank that serves this one waits for a word on the next
  // element it owns that was not granted: "stop" there ends its work here.
  std::vector<int> told;
  int64_t step = grant_step_;
  size_t index = grant_index_;
  std::vector<Element> elements = grant_steps_elements_;
  const std::vector<int> sources = topology_.targets_feeding(rank_);
  try {
    while (told.size() < sources.size() && step < steps_) {
      if (index >= elements.size()) {
        if (++step >= steps_) break;
        elements = topology_.drafter_sequence(rank_, step);
        index = 0;
        continue;
      }
      const Element& e = elements[index++];
      if (std::find(told.begin(), told.end(), e.source) != told.end()) continue;
      board_.stop(rank_, e);
      told.push_back(e.source);
    }
  } catch (const std::exception&) {
    // The store is gone (rank 0 exited): the target ranks are gone with it.
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

InboxFigures DrafterInbox::take_figures() {
  std::lock_guard<std::mutex> lock(mutex_);
  InboxFigures out = figures_;
  figures_ = InboxFigures{};
  figures_.targets = out.targets;  // the newest stay until replaced
  return out;
}

int64_t DrafterInbox::most_held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return most_held_;
}

}  // namespace dflash::pipeline
