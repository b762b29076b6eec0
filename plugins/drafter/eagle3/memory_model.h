#pragma once
// What one EAGLE-3 training step holds on the device, by category, predicted
// from the shapes alone (no tensor is made): the drafter's answer to the
// host's memory planner (ABI 1.2 plan_memory). The counts follow the autograd
// graph of eagle3_model.cpp tensor by tensor (which tensors each operation
// keeps for backward), so a change to the step's arithmetic must change them
// too; docs/eagle3.md lists the derivation and the measurements that check it.
#include "eagle3_model.h"

#include <dflash/sdk/memory_plan.hpp>

#include <cstdint>

namespace dflash::eagle3 {

struct Eagle3StepShape {
  int64_t rows = 1;            // batch rows B
  int64_t row_length = 0;      // positions per row S
  int64_t steps = 7;           // TTT steps K
  int64_t element_bytes = 2;   // of the compute dtype
  bool cuda = true;            // the shared CUDA kernels and (flash_attention) flash attention run
  bool teacher = false;        // the target's last hidden state feeds teacher rows
};

// Trainable elements of a drafter of this shape (fc, the layer, norm, lm_head).
int64_t parameter_count(const Eagle3Shape& s);

// The most rows a step hands the loss: every step's every position.
int64_t loss_rows(const Eagle3StepShape& step);

// The plan's items (phases ACTIVATIONS and BACKWARD) for one step.
sdk::MemoryPlan step_memory(const Eagle3Shape& s, const Eagle3StepShape& step);

}  // namespace dflash::eagle3
