// What both Hugging Face targets hand back through the target ABI, one
// definition: the requested layers' hidden states as "hidden.<id>", then
// "last_hidden" and "logits" where asked for; and the one check of the layer
// ids a caller asks for (the recipe's ids count every decoder layer).
#pragma once

#include <dflash/sdk/torch.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::hf {

// Throws std::invalid_argument naming the first id outside [0, num_layers).
inline void check_layer_ids(const std::vector<int64_t>& ids, int64_t num_layers) {
  for (int64_t id : ids)
    if (id < 0 || id >= num_layers)
      throw std::invalid_argument("layer id " + std::to_string(id) + " is outside [0, " + std::to_string(num_layers) +
                                  ")");
}

// out: a model's outputs (layers: a map id → [B, S, H]; last_hidden; logits).
// single_row: one session's decoding step, returned without its batch
// dimension.
template <class Outputs>
sdk::TensorDict target_outputs(const Outputs& out, const std::vector<int64_t>& layer_ids, bool last_hidden, bool logits,
                               bool single_row = false) {
  const auto row = [&](const at::Tensor& t) { return single_row ? t.select(0, 0) : t; };
  sdk::TensorDict result;
  for (int64_t id : layer_ids) result.set("hidden." + std::to_string(id), row(out.layers.at(id)));
  if (last_hidden) result.set("last_hidden", row(out.last_hidden));
  if (logits) result.set("logits", row(out.logits));
  return result;
}

}  // namespace dflash::hf
