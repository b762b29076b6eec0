// Which device a tensor is on, compared as the host places tensors: every
// room that checks a placement (the frozen weights, the run's parameters,
// the pipeline's transfers, the out-of-memory report) asks the same rule.
#pragma once

#include <c10/core/Device.h>

namespace dflash::host {

// Whether `a` and `b` are the same device. "cuda" without an index is cuda:0:
// the host never changes the current CUDA device, so that is where "cuda" puts
// tensors (train.device is usually written "cuda", tensors report "cuda:0").
bool same_device(const c10::Device& a, const c10::Device& b);

}  // namespace dflash::host
