// What the host needs to know of a drafter, read once from its
// export_config and typed: the block it predicts and which target layers feed
// it. The core never guesses these: a drafter that does not state them is
// refused with a message saying what to add. (A drafter's other keys — a
// DFlash drafter's mask token, say — are its own; eval compares those it
// names in checkpoint_match.)
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflash::host {

class DrafterInstance;

struct DrafterFacts {
  int64_t block_size = 0;                 // tokens a decoding step verifies: the newest and block_size − 1 proposed
  std::vector<int64_t> target_layer_ids;  // 0-based decoder layers, in the order the drafter reads them
};

// `exported`: the drafter's export_config; `label`: the plugin, for messages.
// Throws std::invalid_argument naming the plugin and the key when
// block_size (an integer ≥ 1: training's slot table; decoding asks for
// eval::kMinDecodeBlockSize) or target_layer_ids (a list of integers ≥ 0)
// is missing or malformed.
DrafterFacts parse_drafter_facts(const std::optional<nlohmann::json>& exported, const std::string& label);

// The drafter's facts, from its export_config (after bind_target: a drafter
// may size itself from the target).
DrafterFacts drafter_facts(const DrafterInstance& drafter);

}  // namespace dflash::host
