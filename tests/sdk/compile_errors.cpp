// Plugin classes that get the SDK contract wrong. Compiled (expecting failure)
// once per -DCASE_*, and the compiler's output must carry the SDK's own
// readable message rather than template noise alone (tests/CMakeLists.txt).
#include <dflash/sdk.hpp>

using namespace dflash::sdk;

#if defined(CASE_MISSING_COMPUTE)
class NoCompute : public Loss {
 public:
  static constexpr PluginInfo info{"no_compute", "1.0.0", ""};
  static std::string config_schema() { return Schema().dump(); }
  explicit NoCompute(const CreateContext&) {}
  LossResult comptue(const LossInputs&) { return {}; }  // misspelt
};
DFLASH_PLUGINS(NoCompute)
#elif defined(CASE_HALF_SCHEDULER_STATE)
class HalfState : public Scheduler {
 public:
  static constexpr PluginInfo info{"half_state", "1.0.0", ""};
  static std::string config_schema() { return Schema().dump(); }
  explicit HalfState(const CreateContext&) {}
  double lr_at(int64_t, int64_t, double base) const { return base; }
  nlohmann::json save_state() const { return {}; }  // but no load_state
};
DFLASH_PLUGINS(HalfState)
#elif defined(CASE_NO_SCHEMA)
class NoSchema : public Scheduler {
 public:
  static constexpr PluginInfo info{"no_schema", "1.0.0", ""};
  explicit NoSchema(const CreateContext&) {}
  double lr_at(int64_t, int64_t, double base) const { return base; }
};
DFLASH_PLUGINS(NoSchema)
#elif defined(CASE_NOT_A_KIND)
class Unrelated {
 public:
  static constexpr PluginInfo info{"unrelated", "1.0.0", ""};
  static std::string config_schema() { return Schema().dump(); }
};
DFLASH_PLUGINS(Unrelated)
#elif defined(CASE_BATCH_WITHOUT_DECODING)
class BatchOnly : public TargetModel {
 public:
  static constexpr PluginInfo info{"batch_only", "1.0.0", ""};
  static std::string config_schema() { return Schema().dump(); }
  explicit BatchOnly(const CreateContext&) {}
  nlohmann::json describe() const { return {}; }
  TensorDict forward(const TargetRequest&) { return {}; }
  TensorDict frozen_weights() { return {}; }
  TensorDict decode_extend_batch(const BatchDecodeRequest&) { return {}; }  // but no sessions to step
};
DFLASH_PLUGINS(BatchOnly)
#elif defined(CASE_NO_EXPORT_CONFIG)
class Unstated : public Drafter {  // required since ABI 1.5
 public:
  static constexpr PluginInfo info{"unstated", "1.0.0", ""};
  static std::string config_schema() { return Schema().dump(); }
  explicit Unstated(const CreateContext&) {}
  TensorDict parameters() { return {}; }
  void bind_target(const nlohmann::json&, const TensorDict&) {}
  TensorDict forward(const TensorDict&) { return {}; }
};
DFLASH_PLUGINS(Unstated)
#endif
