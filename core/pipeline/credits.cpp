#include "pipeline/credits.h"

#include <stdexcept>
#include <string>

namespace dflash::pipeline {
namespace {

// The store lives in rank 0 (or torchrun's agent): when it is gone, so is the run.
template <class F>
auto guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const dist::CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    std::string text = e.what();
    throw dist::CollectiveError(std::string("the pipeline's credits (") + what + "): the run's store is unreachable (" +
                                text.substr(0, text.find('\n')) +
                                "), so rank 0 (which serves it) has exited or is stopped. The last checkpoint is intact; "
                                "relaunch to resume from it");
  }
}

}  // namespace

std::string CreditBoard::key(int drafter_rank, const Element& e) {
  return "dflash/pipe/" + std::to_string(drafter_rank) + "/" + std::to_string(e.step) + "/" + std::to_string(e.micro);
}

void CreditBoard::grant(int drafter_rank, const Element& e) {
  guarded("a grant", [&] { store_->set(key(drafter_rank, e), "grant"); });
}

void CreditBoard::stop(int drafter_rank, const Element& e) {
  guarded("a stop", [&] { store_->set(key(drafter_rank, e), "stop"); });
}

Answer CreditBoard::poll(int drafter_rank, const Element& e) {
  return guarded("waiting for a grant", [&] {
    const std::string k = key(drafter_rank, e);
    const std::optional<std::string> value = store_->get_if_set(k);
    if (!value) return Answer::kNone;
    store_->erase(k);
    return *value == "stop" ? Answer::kStop : Answer::kGrant;
  });
}

std::optional<std::string> CreditBoard::failure_of(int rank) {
  return guarded("a rank's failure", [&] { return store_->get_if_set(dist::failure_key(rank)); });
}

std::optional<std::string> CreditBoard::heartbeat_of(int rank) {
  return guarded("a rank's heartbeat", [&] { return store_->get_if_set(dist::heartbeat_key(rank)); });
}

}  // namespace dflash::pipeline
