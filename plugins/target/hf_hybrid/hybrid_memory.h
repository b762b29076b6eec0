// What a hybrid target would hold on its device, for the memory planner:
// from config.json and the checkpoint's headers alone (nothing is loaded),
// counted from what hybrid_model.cpp and gated_deltanet.cpp keep.
#pragma once

#include "hybrid_config.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>

namespace dflash::target {

struct HybridMemory {
  HybridConfig config;
  uint64_t weight_bytes = 0;
  uint64_t forward_bytes = 0;            // one forward over [rows, row_length], hidden states returned not counted
  uint64_t state_bytes_per_session = 0;  // a decoding session's conv windows + recurrent states (fp32), two of each
  uint64_t kv_bytes_per_token = 0;       // its KV cache, per token, over the full-attention layers
};
// on_cuda: the model runs on a CUDA device, where a 16-bit dtype runs the
// delta rule in its CUDA kernels (a GPU build has them: CMake builds them
// wherever LibTorch has CUDA and a CUDA compiler is found).
HybridMemory plan_hybrid_memory(const std::filesystem::path& model_dir, c10::ScalarType dtype, int64_t rows,
                                int64_t row_length, bool on_cuda = false);

}  // namespace dflash::target
