// Timing and memory for the GPU benchmarks (programs, not tests; see
// docs/performance.md for the method): synchronised wall time, the median of
// the timed calls, and the caching allocator's peak above what was in use.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace dflash::bench {

// Wall time of one call of fn, in ms, with the device synchronised after it.
template <class Fn>
double timed_ms(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The median of `repeats` timed calls after `warmup` untimed ones.
template <class Fn>
double median_ms(int warmup, int repeats, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  torch::cuda::synchronize();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) times.push_back(timed_ms(fn));
  return median(times);
}

struct Measurement {
  double median_ms = 0;
  int64_t extra_peak_bytes = 0;  // the largest allocator peak above the memory in use before a timed call
  std::string failure;           // the first line of what a call threw (e.g. out of memory); empty on success
  double extra_peak_gib() const { return static_cast<double>(extra_peak_bytes) / double(1 << 30); }
};

// median_ms on device 0, plus each timed call's peak allocation above what
// was allocated before it. A call that throws ends the measurement: its
// message's first line is recorded and the cache emptied, so the next arm
// starts clean.
template <class Fn>
Measurement measure(int warmup, int repeats, Fn&& fn) {
  auto stats = [] { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0]; };
  Measurement m;
  try {
    for (int i = 0; i < warmup; ++i) fn();
    torch::cuda::synchronize();
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
      const int64_t before = stats().current;
      c10::cuda::CUDACachingAllocator::resetPeakStats(0);
      times.push_back(timed_ms(fn));
      m.extra_peak_bytes = std::max(m.extra_peak_bytes, stats().peak - before);
    }
    m.median_ms = median(times);
  } catch (const std::exception& e) {
    m.failure = e.what();
    m.failure.resize(std::min(m.failure.size(), m.failure.find('\n')));
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
  return m;
}

}  // namespace dflash::bench
