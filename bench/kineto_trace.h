// A Chrome trace (CPU operators and CUDA kernels, through LibTorch's Kineto
// profiler) of one piece of work, for the benchmarks: what the device runs
// at which time, and where it waits for the host. Open it in Perfetto or
// chrome://tracing, or summarise it with scripts/trace_gaps.py.
#pragma once

#include <functional>
#include <string>

namespace dflash::bench {

// Runs `body` with the profiler on and writes the trace to `path`. Returns
// false with `why` where this LibTorch cannot profile (no Kineto) or the file
// cannot be written; the body has run either way.
bool trace_to(const std::string& path, const std::function<void()>& body, std::string& why);

}  // namespace dflash::bench
