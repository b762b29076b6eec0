// dflash/sdk/memory_plan.hpp — tell the host's memory planner (ABI 1.2) what
// an instance would hold on its device, before it exists. A data source,
// target model or drafter class opts in with a static method:
//
//   static dflash::sdk::MemoryPlan plan_memory(const dflash::sdk::PlanRequest& request);
//
// It must allocate no device memory: `dflash-host plan` and the check before
// `train` call it to size a run that has not started. Each item is a line of
// the plan's table; see dflash_memory_phase (abi.h) for when each phase is
// alive and the slot comments for the facts and context of each kind.
#pragma once

#include <dflash/sdk/core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::sdk {

enum class MemoryPhase : int32_t {
  kResident = DFLASH_MEMORY_RESIDENT,
  kTargetForward = DFLASH_MEMORY_TARGET_FORWARD,
  kActivations = DFLASH_MEMORY_ACTIVATIONS,
  kBackward = DFLASH_MEMORY_BACKWARD,
};

class PlanRequest {
 public:
  PlanRequest(const dflash_plan_request* request) {
    if (request == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "plan_memory called without a request");
    config_ = request->config_json ? nlohmann::json::parse(request->config_json) : nlohmann::json::object();
    context_ = request->context_json ? nlohmann::json::parse(request->context_json) : nlohmann::json::object();
    device_ = request->device ? request->device : "cpu";
    dtype_ = request->dtype ? request->dtype : "float32";
  }
  // The plugin's section as create would get it (validated, defaults filled).
  const nlohmann::json& config() const { return config_; }
  // What the host knows already (per kind: see abi.h).
  const nlohmann::json& context() const { return context_; }
  const std::string& device() const { return device_; }
  const std::string& dtype() const { return dtype_; }
  // Bytes per element of the compute dtype.
  int64_t element_bytes() const { return dtype_ == "float32" ? 4 : dtype_ == "float64" ? 8 : 2; }

 private:
  nlohmann::json config_, context_;
  std::string device_, dtype_;
};

struct MemoryPlan {
  struct Item {
    std::string category;
    uint64_t bytes = 0;
    MemoryPhase phase = MemoryPhase::kResident;
  };
  std::vector<Item> items;
  nlohmann::json facts = nlohmann::json::object();

  MemoryPlan& add(std::string category, double bytes, MemoryPhase phase) {
    items.push_back({std::move(category), saturated_bytes(bytes), phase});
    return *this;
  }

  // A byte count computed in double, as uint64: negative or NaN → 0, and
  // anything at or above 2^64 → UINT64_MAX, which the host reports as an
  // overflow (converting such a double directly is undefined behaviour).
  static uint64_t saturated_bytes(double bytes) {
    constexpr double kTwo64 = 18446744073709551616.0;  // 2^64, exact as a double
    if (!(bytes > 0)) return 0;
    if (bytes >= kTwo64) return UINT64_MAX;
    return static_cast<uint64_t>(bytes);
  }
};

namespace detail {

DFLASH_SDK_DETECT(has_plan_memory, T::plan_memory(std::declval<const PlanRequest&>()))

// The C slot over T::plan_memory.
template <class T>
dflash_error* plan_memory_slot(const dflash_host_api* host, const dflash_plan_request* request,
                               dflash_memory_plan* plan) noexcept {
  return guard(host, T::info.name, KindTraits<T, T::kKind>::translate, [&] {
    if (host == nullptr || host->struct_size < DFLASH_SIZE_THROUGH(dflash_host_api, plan_set_facts))
      throw Error(DFLASH_ERR_INVALID_ARGUMENT, "plan_memory: the host's function table predates ABI 1.2");
    static_assert(std::is_same_v<typename has_plan_memory<T>::type, MemoryPlan>,
                  "plan_memory must be `static dflash::sdk::MemoryPlan plan_memory(const dflash::sdk::PlanRequest&)`");
    const MemoryPlan result = T::plan_memory(PlanRequest(request));
    for (const MemoryPlan::Item& item : result.items)
      if (dflash_error* e = host->plan_add(plan, item.category.c_str(), item.bytes, static_cast<int32_t>(item.phase)))
        throw_host_error(host, e, static_cast<dflash_error_code>(host->error_code(e)));
    if (dflash_error* e = host->plan_set_facts(plan, result.facts.dump().c_str()))
      throw_host_error(host, e, DFLASH_ERR_INVALID_ARGUMENT);
  });
}

// The slot value for a kind's table: NULL when T does not plan.
template <class T>
constexpr dflash_plan_memory_fn plan_memory_of() {
  if constexpr (has_plan_memory<T>::value) return &plan_memory_slot<T>;
  else return nullptr;
}

}  // namespace detail
}  // namespace dflash::sdk
