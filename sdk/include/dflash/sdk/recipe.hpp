// Rules of the DFlash recipe that more than one plugin needs (a target
// describing its defaults, a drafter choosing its inputs), written once so
// they cannot drift apart. Header-only, no LibTorch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dflash::sdk {

// Which of a target's `target_layers` decoder layers feed a drafter of
// `count` layers by default: spread evenly from layer 1 to layer L − 3, as
// the reference DFlash code's build_target_layer_ids does (its arithmetic in
// doubles, rounded half to even like Python's round()); one layer: the
// middle, L / 2. These are 0-based decoder-layer indices (Hugging Face's
// hidden_states[id + 1]).
inline std::vector<int64_t> default_target_layer_ids(int64_t target_layers, int64_t count) {
  if (count <= 0) return {};
  if (count == 1) return {target_layers / 2};
  const int64_t first = 1, last = std::max<int64_t>(first, target_layers - 3);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < count; ++i) {
    const double at = static_cast<double>(first) + static_cast<double>(i * (last - first)) / static_cast<double>(count - 1);
    ids.push_back(static_cast<int64_t>(std::nearbyint(at)));
  }
  return ids;
}

}  // namespace dflash::sdk
