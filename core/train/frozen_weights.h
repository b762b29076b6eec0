// The target's frozen tensors that the drafter reuses (embedding, final norm,
// lm_head), placed on a drafter device as that device's own copy: the drafter
// never holds a reference into the target's memory or another device's.
#pragma once

#include "plugin/host_api.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace dflash::host {

// The names every target model must return from frozen_weights.
inline constexpr const char* kFrozenWeightNames[] = {"embed_tokens", "lm_head", "final_norm"};

// One new copy of each of the target's frozen tensors on `device` in `dtype`
// (always new storage, even when the target already sits there), never
// requiring grad. Tensors the target shares (tied embeddings) stay shared in
// the copies, so a tied 248k-vocabulary matrix is copied once. Throws
// std::invalid_argument naming the plugin and any missing tensor.
NamedTensors place_frozen_weights(const NamedTensors& from_target, const std::string& target_name,
                                  const c10::Device& device, c10::ScalarType dtype);

}  // namespace dflash::host
