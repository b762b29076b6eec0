// The target's frozen tensors that the drafter reuses (embedding, final norm,
// lm_head), placed on a drafter device: an explicit copy on that device, never
// a reference to another device's tensor. Where the target's tensor already
// sits on that device in that dtype it is shared, detached and read-only (a
// second copy of a 248k × 5120 matrix would only cost memory).
#pragma once

#include "plugin/host_api.h"
#include "plugin/same_device.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace dflash::host {

// The names every target model must return from frozen_weights.
inline constexpr const char* kFrozenWeightNames[] = {"embed_tokens", "lm_head", "final_norm"};

// Each of the target's frozen tensors on `device` in `dtype`, never requiring
// grad: a new copy, or the target's own tensor (detached) when it is already
// there in that dtype. Tensors the target shares (tied embeddings) stay
// shared, so a tied 248k-vocabulary matrix is copied at most once. Throws
// std::invalid_argument naming the plugin and any missing tensor.
NamedTensors place_frozen_weights(const NamedTensors& from_target, const std::string& target_name,
                                  const c10::Device& device, c10::ScalarType dtype);

}  // namespace dflash::host
