#include "pipeline/frozen_transfer.h"

#include "log/log.h"
#include "memory/memory_plan.h"
#include "pipeline/item.h"
#include "train/frozen_weights.h"

#include <stdexcept>

namespace dflash::pipeline {
namespace {

// The frozen weights as one message: a tensor the target shares under two
// names (tied embeddings) travels once, and stays shared on arrival.
Item frozen_item(train::Run& run) {
  const c10::Device device(run.settings().device);
  Item item;
  item.meta["aliases"] = nlohmann::json::object();
  for (const auto& [name, tensor] : run.target().frozen_weights()) {
    if (!host::same_device(tensor.device(), device))
      throw std::invalid_argument(run.target().record().label() + ": its frozen weight '" + name + "' is on " +
                                  tensor.device().str() + ", but this target rank runs on " + device.str() +
                                  " (train.device): a frozen weight must live on the device of the rank that uses it "
                                  "(the seed's verifier weights left on another GPU). Fix the plugin's frozen_weights");
    bool shared = false;
    for (const auto& [first, kept] : item.features)
      if (kept.is_same(tensor) || (kept.data_ptr() == tensor.data_ptr() && kept.sizes() == tensor.sizes())) {
        item.meta["aliases"][name] = first;
        shared = true;
        break;
      }
    if (!shared) item.features.emplace_back(name, tensor.detach());
  }
  return item;
}

host::NamedTensors unpack_frozen(const Item& item) {
  host::NamedTensors out = item.features;
  for (const auto& [name, first] : item.meta.at("aliases").items())
    for (const auto& [kept, tensor] : item.features)
      if (kept == first.get<std::string>()) out.emplace_back(name, tensor);
  return out;
}

}  // namespace

void exchange_at_start(train::Run& run, dist::Collective& world, const Topology& topology) {
  const int rank = world.rank();
  const bool target = topology.role_of(rank) == Role::kTarget;
  // The target's description, from target rank 0 to everyone.
  const std::vector<std::string> described =
      world.all_gather_text(rank == 0 ? run.target_info().dump() : std::string(), "the target's description");
  if (rank == 0) {
    const Item item = frozen_item(run);
    log::info("sending the target's frozen weights (" + memory::format_bytes(item_bytes(item)) + ") to " +
              std::to_string(topology.drafter_ranks()) + " drafter rank" + (topology.drafter_ranks() > 1 ? "s" : ""));
    for (int d : topology.drafter_world_ranks()) send_item(world, d, item);
  } else if (!target) {
    const Item item = receive_item(world, 0, c10::Device(run.settings().device), "the target's frozen weights");
    run.bind_to_remote_target(nlohmann::json::parse(described.at(0)), unpack_frozen(item));
  }
  // The drafter's facts, from drafter rank 0 to everyone.
  const int first_drafter = topology.target_ranks();
  const std::vector<std::string> facts = world.all_gather_text(
      rank == first_drafter ? run.drafter_config().dump() + "\n" + run.drafter().record().label() : std::string(),
      "the drafter's facts");
  if (target) {
    const std::string& text = facts.at(static_cast<size_t>(first_drafter));
    const size_t split = text.rfind('\n');
    run.adopt_remote_drafter(nlohmann::json::parse(text.substr(0, split)), text.substr(split + 1));
  }
}

}  // namespace dflash::pipeline
