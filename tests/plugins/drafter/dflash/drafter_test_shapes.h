// The drafter shapes the drafter tests share: one tiny shape for fp64 checks
// on the CPU, one small shape for bf16 checks on the GPU (head_dim 16, what
// flash attention takes), and the plugin-level GPU target that matches it.
#pragma once

#include "dflash_model.h"
#include "plugin/instances.h"

#include <nlohmann/json.hpp>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

namespace dflash::drafter::testing {

// 2 layers, hidden 16, 4 heads / 2 KV heads of 8, fed by 2 target layers of 16.
inline DrafterShape tiny_cpu_shape() {
  DrafterShape shape;
  shape.layers = 2;
  shape.hidden = 16;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 8;
  shape.intermediate = 24;
  shape.feature_layers = 2;
  shape.target_hidden = 16;
  shape.rope_theta = 10000.0;
  return shape;
}

// The tiny shape, wider: hidden 64, heads of 16, fed by target layers of 32.
inline DrafterShape small_gpu_shape() {
  DrafterShape shape = tiny_cpu_shape();
  shape.hidden = 64;
  shape.head_dim = 16;
  shape.intermediate = 96;
  shape.target_hidden = 32;
  return shape;
}

// A target's description and random frozen weights (bf16 on CUDA, drawn after
// torch::manual_seed(seed)) for the dflash plugin on the GPU: 8 layers,
// hidden 64, vocabulary 50.
struct GpuTarget {
  nlohmann::json info;
  dflash::host::NamedTensors frozen;
};
inline GpuTarget small_gpu_target(uint64_t seed) {
  GpuTarget t;
  t.info = {{"num_layers", 8}, {"hidden_size", 64}, {"vocab_size", 50}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 96}};
  torch::manual_seed(seed);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  t.frozen = {{"embed_tokens", torch::randn({50, 64}, cuda)}, {"lm_head", torch::randn({50, 64}, cuda)},
              {"final_norm", torch::ones({64}, cuda)}};
  return t;
}

}  // namespace dflash::drafter::testing
