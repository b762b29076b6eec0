// What the host needs to know of a drafter, read once from its
// export_config and typed: the block it predicts, which target layers feed
// it, and its mask token. The core never guesses these: a drafter that does
// not state them is refused with a message saying what to add.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflash::host {

class DrafterInstance;

struct DrafterFacts {
  int64_t block_size = 0;                 // tokens per block: the anchor's and block_size − 1 predicted ones
  std::vector<int64_t> target_layer_ids;  // 0-based decoder layers, in the order the drafter reads them
  std::optional<int64_t> mask_token_id;   // nullopt: the drafter uses no mask token (export_config says null)
};

// `exported`: the drafter's export_config; `label`: the plugin, for messages.
// Throws std::invalid_argument naming the plugin and the key when
// block_size (an integer ≥ 1: training's slot table; decoding asks for
// eval::kMinDecodeBlockSize), target_layer_ids (a list of integers ≥ 0) or
// mask_token_id (an integer ≥ 0, or null) is missing or malformed.
DrafterFacts parse_drafter_facts(const std::optional<nlohmann::json>& exported, const std::string& label);

// The drafter's facts, from its export_config (after bind_target: a drafter
// may size itself from the target).
DrafterFacts drafter_facts(const DrafterInstance& drafter);

}  // namespace dflash::host
