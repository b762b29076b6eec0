// How a plugin's CUDA graphs fared (cuda_graph.h): a header of its own, so
// that a plugin's declarations can carry the counts without the CUDA graph
// headers.
#pragma once

#include <cstdint>
#include <string>

namespace dflash::decode_support {

// Captured, replayed, failed to capture, and the last failure ("" when none).
struct GraphStats {
  int64_t captured = 0, replayed = 0, failed = 0;
  std::string last_error;
};

}  // namespace dflash::decode_support
