#include "pipeline/credits.h"

namespace dflash::pipeline {

std::string CreditBoard::key(int drafter_rank, const Element& e) {
  return "dflash/pipe/" + std::to_string(drafter_rank) + "/" + std::to_string(e.step) + "/" + std::to_string(e.micro);
}

Answer CreditBoard::poll(int drafter_rank, const Element& e) {
  const std::string k = key(drafter_rank, e);
  const std::optional<std::string> value = store_->get_if_set(k);
  if (!value) return Answer::kNone;
  store_->erase(k);
  return *value == "stop" ? Answer::kStop : Answer::kGrant;
}

std::optional<std::string> CreditBoard::failure_of(int rank) {
  return store_->get_if_set("dflash/failed/" + std::to_string(rank));
}

std::optional<std::string> CreditBoard::heartbeat_of(int rank) {
  return store_->get_if_set("dflash/heartbeat/" + std::to_string(rank));
}

}  // namespace dflash::pipeline
