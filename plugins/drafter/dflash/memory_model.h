// What one DFlash training step holds on the device, by category, predicted
// from the shapes alone (no tensor is made): the drafter's answer to the
// host's memory planner (ABI 1.2 plan_memory). The counts follow the autograd
// graph of dflash_model.cpp tensor by tensor — which tensors each op saves for
// backward — so a change to the layer's arithmetic must change them too;
// docs/memory.md lists the derivation and the GPU measurements that check it.
#pragma once

#include <dflash/sdk/recipe.hpp>

#include "dflash_model.h"

#include <dflash/sdk/memory_plan.hpp>

#include <cstdint>
#include <vector>

namespace dflash::drafter {

// The drafter's shape resolved from its config and the target's description,
// exactly as bind_target resolves it; throws sdk::Error naming the key.
struct ResolvedShape {
  DrafterShape shape;
  std::vector<int64_t> layer_ids;
  int64_t vocab = 0, mask_token = 0;
  int64_t target_layers = 0;  // the target's decoder layers
};
ResolvedShape resolve_shape(const nlohmann::json& config, const nlohmann::json& target);

// The recipe's default target layers (one definition, in the SDK).
using sdk::default_target_layer_ids;

// Trainable elements of a drafter of this shape (fc, norms, every layer).
int64_t parameter_count(const DrafterShape& s);
int64_t layer_parameter_count(const DrafterShape& s);

struct StepShape {
  int64_t rows = 1;            // batch rows B
  int64_t row_length = 0;      // context positions per row S
  int64_t anchors = 0;         // blocks per row (max_anchors: the most a row can get)
  int64_t block_size = 0;
  int64_t group_blocks = 0;    // 0 = dense attention
  int64_t element_bytes = 2;   // of the compute dtype
  bool cuda = true;            // fused attention kernels; false = SDPA's math path (scores materialised)
  bool cudnn = true;           // cuDNN attention (GQA native) rather than SDPA with repeated K/V
  bool checkpointing = false;  // activation checkpointing per layer
  bool fused = true;           // layer_ops fused (trainable_ops) rather than aten (op-by-op autograd)
  bool keeps_rows = false;     // grouped attention keeps the layer's q/k/v rows, not each call's copies
  bool block_kernel = false;   // attention: blocks on the GPU (keeps rows, no masks)
  bool block_reference = false;  // attention: blocks on the CPU, by the kernel's ATen reference (as block_kernel,
                                 // plus each part's scores at once: largest in the backward)
  bool teacher = false;        // the target's last hidden state feeds teacher rows
};

// The plan's items (phases ACTIVATIONS and BACKWARD) for one step.
sdk::MemoryPlan step_memory(const DrafterShape& s, const StepShape& step);

}  // namespace dflash::drafter
