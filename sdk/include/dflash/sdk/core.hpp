// dflash/sdk/core.hpp — the part of the C++ SDK that needs no LibTorch:
// errors, the guard that keeps exceptions from crossing the C ABI, the
// create context, and the registration machinery behind DFLASH_PLUGINS.
#pragma once

#include <dflash/abi.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

namespace dflash::sdk {

// Throw this from plugin code to report an error with a specific code; any
// other exception becomes DFLASH_ERR_INTERNAL (or OUT_OF_MEMORY for bad_alloc).
class Error : public std::runtime_error {
 public:
  Error(dflash_error_code code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  dflash_error_code code() const noexcept { return code_; }

 private:
  dflash_error_code code_;
};

// Static facts about a plugin; every plugin class declares
//   static constexpr dflash::sdk::PluginInfo info{"name", "1.0.0", "one line"};
struct PluginInfo {
  const char* name;
  const char* version;
  const char* description;
};

namespace detail {

// Maps exceptions of other libraries (LibTorch's) onto error codes and short
// messages. Each kind names its translator (KindTraits::translate), so this
// header stays free of LibTorch. Returns false for exceptions it does not know.
using ExceptionTranslator = bool (*)(const std::exception&, dflash_error_code*, std::string*);

inline dflash_error* to_abi_error(const dflash_host_api* host, dflash_error_code code,
                                  const std::string& message) noexcept {
  if (host == nullptr) return nullptr;  // cannot happen with a conforming host
  return host->error_new(static_cast<int32_t>(code), message.c_str());
}

// Takes an error the host returned to the plugin, frees it, and throws it on
// as an Error with `code`, so the guard hands it back with the plugin's name.
[[noreturn]] inline void throw_host_error(const dflash_host_api* host, dflash_error* error, dflash_error_code code) {
  std::string message = host->error_message(error);
  host->error_free(error);
  throw Error(code, message);
}

// Runs `fn`; turns every exception into a host error object. Nothing unwinds
// through the C frames of the caller.
template <class Fn>
dflash_error* guard(const dflash_host_api* host, const char* plugin_name,
                    ExceptionTranslator translate, Fn&& fn) noexcept {
  const std::string who = std::string(plugin_name ? plugin_name : "?") + ": ";
  try {
    fn();
    return nullptr;
  } catch (const Error& e) {
    return to_abi_error(host, e.code(), who + e.what());
  } catch (const std::bad_alloc&) {
    return to_abi_error(host, DFLASH_ERR_OUT_OF_MEMORY, who + "out of host memory");
  } catch (const std::exception& e) {
    dflash_error_code code = DFLASH_ERR_INTERNAL;
    std::string message = e.what();
    // The whole text (LibTorch's has its backtrace) goes to the host's log at
    // debug level before the translator shortens it for the error.
    if (host != nullptr && host->log != nullptr)
      host->log(DFLASH_LOG_DEBUG, plugin_name ? plugin_name : "?", (std::string("exception: ") + e.what()).c_str());
    if (translate != nullptr) translate(e, &code, &message);
    return to_abi_error(host, code, who + message);
  } catch (...) {
    return to_abi_error(host, DFLASH_ERR_INTERNAL, who + "unknown exception");
  }
}

}  // namespace detail

// What a plugin's constructor receives.
class CreateContext {
 public:
  CreateContext(const dflash_host_api* host, const dflash_create_args* args, const char* plugin_name)
      : host_(host), plugin_name_(plugin_name) {
    if (args == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "create called without arguments");
    config_ = args->config_json ? nlohmann::json::parse(args->config_json) : nlohmann::json::object();
    device_ = args->device ? args->device : "cpu";
    dtype_ = args->dtype ? args->dtype : "float32";
    seed_ = args->seed;
  }
  // The plugin's section of the config, validated against its schema and with
  // every default filled in: `config().at("temperature")` never misses.
  const nlohmann::json& config() const { return config_; }
  const std::string& device() const { return device_; }
  const std::string& dtype() const { return dtype_; }
  uint64_t seed() const { return seed_; }
  const dflash_host_api* host() const { return host_; }
  void log(dflash_log_level level, const std::string& message) const {
    host_->log(level, plugin_name_, message.c_str());
  }

 private:
  const dflash_host_api* host_;
  const char* plugin_name_;
  nlohmann::json config_;
  std::string device_, dtype_;
  uint64_t seed_ = 0;
};

namespace detail {

// What the C side's `dflash_instance*` points to for an SDK plugin.
template <class T>
struct Instance {
  const dflash_host_api* host;
  std::unique_ptr<T> impl;
  std::string scratch;        // strings returned as borrowed(next call)
  std::string long_lived;     // strings returned as borrowed(destroy)
};

template <class T>
Instance<T>* instance_of(dflash_instance* self) { return reinterpret_cast<Instance<T>*>(self); }

// Per-kind glue: specialised in loss.hpp, scheduler.hpp, ... Each provides
// `static const void* vtable()`, `static const dflash_torch_build* torch_build()`
// (nullptr for kinds that exchange no LibTorch tensors) and
// `static constexpr ExceptionTranslator translate`.
template <class T, dflash_kind Kind>
struct KindTraits;

// DFLASH_SDK_DETECT(trait, expression using `std::declval<T&>()`): trait<T>
// tells whether the expression compiles and, in ::type, what it returns. The
// kinds use it for optional methods and for readable errors on required ones.
#define DFLASH_SDK_DETECT(trait, ...)                                         \
  template <class T, class = void>                                            \
  struct trait : std::false_type {                                            \
    using type = void;                                                        \
  };                                                                          \
  template <class T>                                                          \
  struct trait<T, std::void_t<decltype(__VA_ARGS__)>> : std::true_type {      \
    using type = decltype(__VA_ARGS__);                                       \
  };

template <class T, class = void>
struct has_kind : std::false_type {};
template <class T>
struct has_kind<T, std::void_t<decltype(T::kKind)>> : std::true_type {};

template <class T, class = void>
struct has_config_schema : std::false_type {};
template <class T>
struct has_config_schema<T, std::void_t<decltype(T::config_schema())>> : std::true_type {};

// A kind's traits may name the oldest host minor its plugin can run under
// (static uint32_t host_minor_needed()): a slot that an older host would
// never call, where doing without it gives wrong results, not missing ones.
DFLASH_SDK_DETECT(has_host_minor_needed, T::host_minor_needed())

template <class T>
dflash_error* create(const dflash_host_api* host, const dflash_create_args* args,
                     dflash_instance** out) noexcept {
  return guard(host, T::info.name, KindTraits<T, T::kKind>::translate, [&] {
    if (out == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "create called without an output pointer");
    if (host->struct_size < DFLASH_SIZE_THROUGH(dflash_host_api, map_tensor_at))
      throw Error(DFLASH_ERR_INVALID_ARGUMENT, "the host's function table is older than this SDK (ABI 1.0)");
    using Traits = KindTraits<T, T::kKind>;
    if constexpr (has_host_minor_needed<Traits>::value) {
      if (host->abi_minor < Traits::host_minor_needed())
        throw Error(DFLASH_ERR_INVALID_ARGUMENT,
                    std::string(T::info.name) + " needs a host of plugin ABI 1." + std::to_string(Traits::host_minor_needed()) +
                        " or later (" + Traits::host_minor_reason() + "); this host is ABI 1." +
                        std::to_string(host->abi_minor) + ": update dflash-host");
    }
    CreateContext context(host, args, T::info.name);
    auto instance = std::make_unique<Instance<T>>();
    instance->host = host;
    instance->impl = std::make_unique<T>(context);
    *out = reinterpret_cast<dflash_instance*>(instance.release());
  });
}

template <class T>
void destroy(dflash_instance* self) noexcept {
  // A destructor that throws is a bug; it must not take the host down.
  try {
    delete instance_of<T>(self);
  } catch (...) {
  }
}

template <class T>
const dflash_plugin_descriptor* descriptor_of() noexcept {
  static_assert(has_kind<T>::value,
                "a plugin class must derive from one of dflash::sdk::Loss, Scheduler, "
                "DataSource, TargetModel, Drafter");
  static_assert(has_config_schema<T>::value,
                "a plugin class must declare `static std::string config_schema()` "
                "(a JSON schema; dflash::sdk::Schema builds one)");
  static const std::string schema = [] {
    try {
      return std::string(T::config_schema());
    } catch (...) {
      return std::string("<config_schema() threw>");  // the host reports it as invalid JSON
    }
  }();
  static const dflash_plugin_descriptor descriptor = {
      sizeof(dflash_plugin_descriptor),
      static_cast<int32_t>(T::kKind),
      T::info.name,
      T::info.version,
      T::info.description,
      schema.c_str(),
      &create<T>,
      &destroy<T>,
      KindTraits<T, T::kKind>::vtable(),
  };
  return &descriptor;
}

template <class... Ts>
const dflash_torch_build* first_torch_build() noexcept {
  const dflash_torch_build* builds[] = {KindTraits<Ts, Ts::kKind>::torch_build()...};
  for (const auto* build : builds)
    if (build != nullptr) return build;
  return nullptr;
}

template <class... Ts>
const dflash_plugin_library* library_of() noexcept {
  static const dflash_plugin_descriptor* const descriptors[] = {descriptor_of<Ts>()...};
  static const dflash_plugin_library library = {
      sizeof(dflash_plugin_library), DFLASH_ABI_MAJOR, DFLASH_ABI_MINOR,
      first_torch_build<Ts...>(), sizeof...(Ts), descriptors,
  };
  return &library;
}

// Returns a string the C side borrows until the next call on the instance.
template <class T>
const char* keep_until_next_call(Instance<T>* instance, std::string text) {
  instance->scratch = std::move(text);
  return instance->scratch.c_str();
}

}  // namespace detail
}  // namespace dflash::sdk

static_assert(DFLASH_ABI_MAJOR == 1, "DFLASH_PLUGINS below exports the v1 entry symbol");

// Exports the library's entry point, listing every plugin class it holds:
//   DFLASH_PLUGINS(MyLoss)            or   DFLASH_PLUGINS(MyLoss, MyScheduler)
// Use it once per library, in one source file.
#define DFLASH_PLUGINS(...)                                                         \
  extern "C" DFLASH_EXPORT const dflash_plugin_library* dflash_plugin_entry_v1(void) { \
    return ::dflash::sdk::detail::library_of<__VA_ARGS__>();                        \
  }
