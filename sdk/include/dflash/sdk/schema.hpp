// dflash/sdk/schema.hpp — builds a plugin's config schema (the JSON Schema
// subset described in docs/config.md) without writing JSON by hand:
//
//   static std::string config_schema() {
//     return dflash::sdk::Schema()
//         .number("temperature", 1.0, "softmax temperature", dflash::sdk::Bounds::above(0))
//         .string("reduction", "mean", "how rows combine", {"mean", "sum"})
//         .dump();
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash::sdk {

struct Bounds {
  std::optional<double> minimum, maximum, exclusive_minimum, exclusive_maximum;
  static Bounds at_least(double v) { Bounds b; b.minimum = v; return b; }
  static Bounds above(double v) { Bounds b; b.exclusive_minimum = v; return b; }
  static Bounds at_most(double v) { Bounds b; b.maximum = v; return b; }
  static Bounds between(double lo, double hi) { Bounds b; b.minimum = lo; b.maximum = hi; return b; }
  // The same bounds with an upper one added: Bounds::above(0).up_to(10).
  Bounds up_to(double hi) const {
    Bounds b = *this;
    b.maximum = hi;
    return b;
  }
  static Bounds strictly_between(double lo, double hi) {
    Bounds b;
    b.exclusive_minimum = lo;
    b.exclusive_maximum = hi;
    return b;
  }
  // Bounds of an integer property are written as integers (3, not 3.0),
  // clamped to int64_t (converting a double outside it is undefined).
  void write(nlohmann::json& property, bool integer) const {
    auto value = [integer](double v) { return integer ? nlohmann::json(to_int64(v)) : nlohmann::json(v); };
    if (minimum) property["minimum"] = value(*minimum);
    if (maximum) property["maximum"] = value(*maximum);
    if (exclusive_minimum) property["exclusiveMinimum"] = value(*exclusive_minimum);
    if (exclusive_maximum) property["exclusiveMaximum"] = value(*exclusive_maximum);
  }
  static int64_t to_int64(double v) {
    constexpr double kTwo63 = 9223372036854775808.0;  // 2^63, exact as a double
    if (v >= kTwo63) return INT64_MAX;
    if (v < -kTwo63) return INT64_MIN;
    return static_cast<int64_t>(v);
  }
};

class Schema {
 public:
  Schema() : json_{{"type", "object"}, {"properties", nlohmann::json::object()}} {}

  Schema& boolean(const std::string& name, bool fallback, const std::string& description) {
    return add(name, {{"type", "boolean"}, {"default", fallback}, {"description", description}});
  }
  Schema& integer(const std::string& name, int64_t fallback, const std::string& description,
                  const Bounds& bounds = {}) {
    nlohmann::json p{{"type", "integer"}, {"default", fallback}, {"description", description}};
    bounds.write(p, true);
    return add(name, std::move(p));
  }
  Schema& number(const std::string& name, double fallback, const std::string& description,
                 const Bounds& bounds = {}) {
    nlohmann::json p{{"type", "number"}, {"default", fallback}, {"description", description}};
    bounds.write(p, false);
    return add(name, std::move(p));
  }
  Schema& string(const std::string& name, const std::string& fallback, const std::string& description,
                 const std::vector<std::string>& allowed = {}) {
    nlohmann::json p{{"type", "string"}, {"default", fallback}, {"description", description}};
    if (!allowed.empty()) p["enum"] = allowed;
    return add(name, std::move(p));
  }
  // A device name (cpu, cuda or cuda:N): the host refuses anything else,
  // e.g. "gpu", when it checks the config (schema keyword "format": "device").
  Schema& device(const std::string& name, const std::string& fallback, const std::string& description) {
    return add(name, {{"type", "string"}, {"format", "device"}, {"default", fallback}, {"description", description}});
  }
  // A string the user must set (no default), e.g. a checkpoint path.
  Schema& required_string(const std::string& name, const std::string& description) {
    add(name, {{"type", "string"}, {"description", description}});
    json_["required"].push_back(name);
    return *this;
  }
  Schema& integer_array(const std::string& name, const std::vector<int64_t>& fallback,
                        const std::string& description, const Bounds& item_bounds = {}) {
    nlohmann::json items{{"type", "integer"}};
    item_bounds.write(items, true);
    return add(name, {{"type", "array"}, {"items", items}, {"default", fallback}, {"description", description}});
  }
  Schema& object(const std::string& name, const Schema& nested, const std::string& description) {
    nlohmann::json p = nested.json_;
    p["description"] = description;
    return add(name, std::move(p));
  }
  // Any other property, written as JSON by hand.
  Schema& property(const std::string& name, nlohmann::json definition) {
    return add(name, std::move(definition));
  }

  // Marks the integer property added last as a memory knob (ABI 1.2): its
  // smaller values need less device memory, and when a run does not fit the
  // host's planner proposes the largest value that does, under `label`
  // (e.g. "token budget"). Written as the schema keyword "memoryKnob".
  Schema& memory_knob(const std::string& label) {
    if (last_.empty() || json_["properties"][last_].value("type", "") != "integer")
      throw std::logic_error("Schema::memory_knob must follow an integer property");
    json_["properties"][last_]["memoryKnob"] = label;
    return *this;
  }

  const nlohmann::json& json() const { return json_; }
  std::string dump() const { return json_.dump(); }

 private:
  Schema& add(const std::string& name, nlohmann::json definition) {
    json_["properties"][name] = std::move(definition);
    last_ = name;
    return *this;
  }
  nlohmann::json json_;
  std::string last_;
};

}  // namespace dflash::sdk
