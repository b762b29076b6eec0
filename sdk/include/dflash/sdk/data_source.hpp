// dflash/sdk/data_source.hpp — write a data source plugin:
//
//   class MyData : public dflash::sdk::DataSource {
//    public:
//     static constexpr dflash::sdk::PluginInfo info{"my_data", "1.0.0", "..."};
//     static std::string config_schema();
//     explicit MyData(const dflash::sdk::CreateContext& context);
//     std::optional<dflash::sdk::TensorDict> next_batch();   // nullopt at the end
//     nlohmann::json save_state() const;
//     void load_state(const nlohmann::json& state);
//     nlohmann::json describe() const;                        // optional
//     // optional (ABI 1.2): the batch shape for the memory planner, no instance needed
//     static dflash::sdk::MemoryPlan plan_memory(const dflash::sdk::PlanRequest& request);
//   };
//   DFLASH_PLUGINS(MyData)
//
// Batch tensor names are listed in dflash/abi.h (dflash_data_source_vtable).
#pragma once

#include <dflash/sdk/memory_plan.hpp>
#include <dflash/sdk/schema.hpp>
#include <dflash/sdk/torch.hpp>

#include <optional>

namespace dflash::sdk {

class DataSource {
 public:
  static constexpr dflash_kind kKind = DFLASH_KIND_DATA_SOURCE;
};

namespace detail {

DFLASH_SDK_DETECT(has_next_batch, std::declval<T&>().next_batch())
DFLASH_SDK_DETECT(has_describe, nlohmann::json(std::declval<T&>().describe()))
DFLASH_SDK_DETECT(has_data_save_state, nlohmann::json(std::declval<T&>().save_state()))
DFLASH_SDK_DETECT(has_data_load_state, std::declval<T&>().load_state(std::declval<const nlohmann::json&>()))

template <class T>
struct KindTraits<T, DFLASH_KIND_DATA_SOURCE> : TorchKind {
  static_assert(std::is_same_v<typename has_next_batch<T>::type, std::optional<TensorDict>>,
                "a DataSource plugin needs `std::optional<TensorDict> next_batch()`");
  static_assert(has_data_save_state<T>::value && has_data_load_state<T>::value,
                "a DataSource plugin needs `nlohmann::json save_state()` and `void load_state(const nlohmann::json&)`: "
                "resuming a run must restore the data position");

  static dflash_error* next_batch(dflash_instance* self, dflash_tensor_map* batch, int32_t* end_of_data) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if (end_of_data == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "next_batch called without end_of_data");
      std::optional<TensorDict> next = instance->impl->next_batch();
      *end_of_data = next ? 0 : 1;
      if (next) write_map(instance->host, batch, *next);
    });
  }
  static dflash_error* save_state(dflash_instance* self, const char** out_json) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      *out_json = keep_until_next_call(instance, nlohmann::json(instance->impl->save_state()).dump());
    });
  }
  static dflash_error* load_state(dflash_instance* self, const char* state_json) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      instance->impl->load_state(nlohmann::json::parse(state_json ? state_json : "null"));
    });
  }
  static dflash_error* describe(dflash_instance* self, const char** out_json) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (has_describe<T>::value) {
        instance->long_lived = nlohmann::json(instance->impl->describe()).dump();
        *out_json = instance->long_lived.c_str();
      }
    });
  }
  static const void* vtable() noexcept {
    static const dflash_data_source_vtable table = {
        sizeof(dflash_data_source_vtable), &next_batch, &save_state, &load_state,
        has_describe<T>::value ? &describe : nullptr,
        plan_memory_of<T>(),
    };
    return &table;
  }
};

}  // namespace detail
}  // namespace dflash::sdk
