// dflash/sdk/scheduler.hpp — write an LR scheduler plugin (needs no LibTorch):
//
//   class MySchedule : public dflash::sdk::Scheduler {
//    public:
//     static constexpr dflash::sdk::PluginInfo info{"my_schedule", "1.0.0", "..."};
//     static std::string config_schema();
//     explicit MySchedule(const dflash::sdk::CreateContext& context);
//     double lr_at(int64_t step, int64_t total_steps, double base_lr) const;
//     // optional, for schedules with state beyond the step:
//     nlohmann::json save_state() const;
//     void load_state(const nlohmann::json& state);
//   };
//   DFLASH_PLUGINS(MySchedule)
#pragma once

#include <dflash/sdk/core.hpp>
#include <dflash/sdk/schema.hpp>

#include <cmath>

namespace dflash::sdk {

class Scheduler {
 public:
  static constexpr dflash_kind kKind = DFLASH_KIND_SCHEDULER;
};

namespace detail {

DFLASH_SDK_DETECT(has_lr_at, std::declval<T&>().lr_at(int64_t{}, int64_t{}, double{}))
DFLASH_SDK_DETECT(has_save_state, std::declval<T&>().save_state())
DFLASH_SDK_DETECT(has_load_state, std::declval<T&>().load_state(std::declval<const nlohmann::json&>()))
template <class T>
struct has_scheduler_state : std::bool_constant<has_save_state<T>::value && has_load_state<T>::value> {};

template <class T>
struct KindTraits<T, DFLASH_KIND_SCHEDULER> {
  static_assert(has_lr_at<T>::value && std::is_convertible_v<typename has_lr_at<T>::type, double>,
                "a Scheduler plugin needs `double lr_at(int64_t step, int64_t total_steps, double base_lr)`");
  static_assert(has_save_state<T>::value == has_load_state<T>::value,
                "a Scheduler with state needs both `nlohmann::json save_state()` and "
                "`void load_state(const nlohmann::json&)`, or neither");
  static const dflash_torch_build* torch_build() noexcept { return nullptr; }
  static constexpr ExceptionTranslator translate = nullptr;

  static dflash_error* lr_at(dflash_instance* self, const dflash_schedule_point* point, double* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if (point == nullptr || out == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "lr_at called with null arguments");
      const double lr = instance->impl->lr_at(point->step, point->total_steps, point->base_lr);
      if (!std::isfinite(lr) || lr < 0)
        throw Error(DFLASH_ERR_INTERNAL, "lr_at(" + std::to_string(point->step) + ") returned " + std::to_string(lr) +
                                             "; a learning rate must be finite and >= 0");
      *out = lr;
    });
  }
  static dflash_error* save_state(dflash_instance* self, const char** out_json) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (has_scheduler_state<T>::value)
        *out_json = keep_until_next_call(instance, instance->impl->save_state().dump());
    });
  }
  static dflash_error* load_state(dflash_instance* self, const char* state_json) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if (state_json == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "load_state called with NULL state");
      if constexpr (has_scheduler_state<T>::value) instance->impl->load_state(nlohmann::json::parse(state_json));
    });
  }
  static const void* vtable() noexcept {
    constexpr bool stateful = has_scheduler_state<T>::value;
    static const dflash_scheduler_vtable table = {
        sizeof(dflash_scheduler_vtable),
        &lr_at,
        stateful ? &save_state : nullptr,
        stateful ? &load_state : nullptr,
    };
    return &table;
  }
};

}  // namespace detail
}  // namespace dflash::sdk
