#include "kineto_trace.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <exception>
#include <memory>
#include <set>

namespace dflash::bench {

bool trace_to(const std::string& path, const std::function<void()>& body, std::string& why) {
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities = {ActivityType::CPU, ActivityType::CUDA};
  bool on = false;
  try {
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
    on = true;
  } catch (const std::exception& e) {
    why = std::string("the profiler did not start: ") + e.what();
  }
  body();
  if (torch::cuda::is_available()) torch::cuda::synchronize();
  if (!on) return false;
  try {
    const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
    result->save(path);
  } catch (const std::exception& e) {
    why = "the trace was not written to " + path + ": " + e.what();
    return false;
  }
  return true;
}

}  // namespace dflash::bench
