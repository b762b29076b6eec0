#include "config/host_config.h"

#include <gtest/gtest.h>

#include "config_error.h"
#include "support/expect.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using dflash::config::ConfigError;
using dflash::config::plugin_config_of;
using dflash::config::plugin_sections;
using dflash::config::PluginSchema;
using dflash::config::resolve_config;
using dflash::config::ResolvedConfig;
using dflash::config::SchemaLookup;
using nlohmann::json;


struct NoSuchPlugin : std::runtime_error {
  using std::runtime_error::runtime_error;
};

json host_schema() {
  return json::parse(R"({"type":"object","properties":{
      "seed":{"type":"integer","default":0,"minimum":0},
      "device":{"type":"string","enum":["cpu","cuda"],"default":"cuda"},
      "steps":{"type":"integer","default":1000,"minimum":1}}})");
}

json kl_schema() {
  return json::parse(R"({"type":"object","properties":{
      "temperature":{"type":"number","default":1.0,"exclusiveMinimum":0},
      "reduction":{"type":"string","enum":["mean","sum"],"default":"mean"}}})");
}

// A fake plugin registry that records what it was asked for.
class FakeRegistry {
 public:
  SchemaLookup lookup() {
    return [this](const std::string& section, const std::string& name) -> PluginSchema {
      calls.emplace_back(section, name);
      if (section == "loss" && name == "kl") return {kl_schema(), "plugin loss 'kl' from /x/libkl.so"};
      if (section == "scheduler" && name == "constant") {
        return {json{{"type", "object"}}, "plugin scheduler 'constant' from /x/libsched.so"};
      }
      if (section == "data" && name == "jsonl") {
        return {json::parse(R"({"type":"object","required":["path"],"properties":{"path":{"type":"string"}}})"),
                "plugin data 'jsonl' from /x/libdata.so"};
      }
      if (section == "drafter" && name == "broken") {
        return {json::parse(R"({"type":"object","properties":{"k":{"type":"integer","default":-1,"minimum":0}}})"),
                "plugin drafter 'broken' from /x/libbroken.so"};
      }
      if (section == "target" && name == "sneaky") {
        return {json::parse(R"({"type":"object","properties":{"plugin":{"type":"string"}}})"),
                "plugin target 'sneaky' from /x/libsneaky.so"};
      }
      throw NoSuchPlugin("no " + section + " plugin named '" + name + "'");
    };
  }
  std::vector<std::pair<std::string, std::string>> calls;
};


ConfigError resolve_error(const json& raw, const std::vector<std::string>& required = {}) {
  FakeRegistry registry;
  return config_error([&] { (void)resolve_config(raw, host_schema(), registry.lookup(), required); });
}

TEST(PluginSections, AreTheFiveKinds) {
  EXPECT_EQ(plugin_sections(), (std::vector<std::string>{"data", "target", "drafter", "loss", "scheduler"}));
}

TEST(ResolveConfig, EndToEnd) {
  FakeRegistry registry;
  const json raw = json::parse(R"({"train":{"seed":1,"device":"cpu"},
                                   "loss":{"plugin":"kl","temperature":2.0},
                                   "scheduler":{"plugin":"constant"}})");
  const ResolvedConfig resolved = resolve_config(raw, host_schema(), registry.lookup(), {"loss"});
  EXPECT_EQ(resolved.root, json::parse(R"({
      "train":{"seed":1,"device":"cpu","steps":1000},
      "loss":{"plugin":"kl","temperature":2.0,"reduction":"mean"},
      "scheduler":{"plugin":"constant"}})"));
  EXPECT_EQ(registry.calls, (std::vector<std::pair<std::string, std::string>>{{"loss", "kl"},
                                                                              {"scheduler", "constant"}}));
  EXPECT_EQ(plugin_config_of(resolved, "loss"), json::parse(R"({"temperature":2.0,"reduction":"mean"})"));
  EXPECT_EQ(plugin_config_of(resolved, "scheduler"), json::object());
  EXPECT_THROW((void)plugin_config_of(resolved, "data"), std::out_of_range);
}

TEST(ResolveConfig, AbsentTrainGetsHostDefaultsAndAbsentSectionsStayAbsent) {
  FakeRegistry registry;
  for (const json& raw : {json::object(), json()}) {
    const ResolvedConfig resolved = resolve_config(raw, host_schema(), registry.lookup(), {});
    EXPECT_EQ(resolved.root, json::parse(R"({"train":{"seed":0,"device":"cuda","steps":1000}})"));
  }
  EXPECT_TRUE(registry.calls.empty());
}

TEST(ResolveConfig, EmptySectionWithoutPluginIsLikeAnAbsentOne) {
  FakeRegistry registry;
  const json raw = json::parse(R"({"loss":{},"data":{"plugin":""}})");
  const ResolvedConfig resolved = resolve_config(raw, host_schema(), registry.lookup(), {});
  EXPECT_FALSE(resolved.root.contains("loss"));
  EXPECT_FALSE(resolved.root.contains("data"));
  EXPECT_TRUE(registry.calls.empty());
}

TEST(ResolveConfig, HostSettingsAreValidated) {
  const ConfigError e = resolve_error(json::parse(R"({"train":{"device":"gpu"}})"));
  EXPECT_EQ(e.path(), "train.device");
  EXPECT_EQ(std::string(e.what()),
            "train.device: \"gpu\" is not an allowed value, did you mean \"cpu\"?; accepted: one of \"cpu\", \"cuda\" (dflash-host)");
  EXPECT_EQ(resolve_error(json::parse(R"({"train":{"sed":1}})")).path(), "train.sed");
  EXPECT_CONTAINS(resolve_error(json::parse(R"({"train":{"sed":1}})")).what(), "did you mean \"seed\"?");
  EXPECT_EQ(resolve_error(json::parse(R"({"train":[1]})")).path(), "train");
}

TEST(ResolveConfig, UnknownSection) {
  ConfigError e = resolve_error(json::parse(R"({"los":{"plugin":"kl"}})"));
  EXPECT_EQ(e.path(), "los");
  EXPECT_EQ(std::string(e.what()),
            "los: unknown section, did you mean \"loss\"?; accepted sections: data, drafter, loss, scheduler, "
            "target, train");
  e = resolve_error(json::parse(R"({"optimizer":{}})"));
  EXPECT_EQ(e.path(), "optimizer");
  EXPECT_EQ(std::string(e.what()),
            "optimizer: unknown section; accepted sections: data, drafter, loss, scheduler, target, train");
}

TEST(ResolveConfig, TopLevelMustBeAnObject) {
  const ConfigError e = resolve_error(json::array());
  EXPECT_EQ(e.path(), "");
  EXPECT_CONTAINS(e.what(), "(top level): expected an object, got array []");
}

TEST(ResolveConfig, PluginSectionMustBeAnObject) {
  ConfigError e = resolve_error(json::parse(R"({"loss":"kl"})"));
  EXPECT_EQ(e.path(), "loss");
  EXPECT_EQ(std::string(e.what()),
            "loss: expected an object, got string \"kl\"; accepted: object with \"plugin\" naming the loss plugin "
            "and its settings, e.g. {\"plugin\": \"kl\"}");
  e = resolve_error(json::parse(R"({"data":[1]})"));
  EXPECT_EQ(e.path(), "data");
  EXPECT_CONTAINS(e.what(), "data: expected an object, got array [1]");
  EXPECT_CONTAINS(e.what(), "e.g. {\"plugin\": \"NAME\"}");
}

TEST(ResolveConfig, MissingPluginKeyInASectionWithSettings) {
  const ConfigError e = resolve_error(json::parse(R"({"loss":{"temperature":2}})"));
  EXPECT_EQ(e.path(), "loss.plugin");
  EXPECT_EQ(std::string(e.what()),
            "loss.plugin: no loss plugin chosen; set \"plugin\" in the config or pass --loss NAME");
  EXPECT_EQ(resolve_error(json::parse(R"({"loss":{"plugin":"","temperature":2}})")).path(), "loss.plugin");
}

TEST(ResolveConfig, PluginKeyOfTheWrongType) {
  const ConfigError e = resolve_error(json::parse(R"({"scheduler":{"plugin":5}})"));
  EXPECT_EQ(e.path(), "scheduler.plugin");
  EXPECT_EQ(std::string(e.what()),
            "scheduler.plugin: no scheduler plugin chosen (expected a non-empty string, got integer 5); set "
            "\"plugin\" in the config or pass --scheduler NAME");
}

TEST(ResolveConfig, RequiredSections) {
  ConfigError e = resolve_error(json::object(), {"data", "loss"});
  EXPECT_EQ(e.path(), "data.plugin");
  EXPECT_EQ(std::string(e.what()),
            "data.plugin: no data plugin chosen; set \"plugin\" in the config or pass --data NAME");
  e = resolve_error(json::parse(R"({"data":{"plugin":"jsonl","path":"x"},"target":{}})"), {"data", "target"});
  EXPECT_EQ(e.path(), "target.plugin");
  EXPECT_CONTAINS(e.what(), "pass --target NAME");
  FakeRegistry registry;
  const ResolvedConfig ok = resolve_config(json::parse(R"({"data":{"plugin":"jsonl","path":"x"}})"), host_schema(),
                                           registry.lookup(), {"data"});
  EXPECT_EQ(ok.root["data"], json::parse(R"({"plugin":"jsonl","path":"x"})"));
}

TEST(ResolveConfig, RequiredSectionsMustBePluginSections) {
  FakeRegistry registry;
  EXPECT_THROW((void)resolve_config(json::object(), host_schema(), registry.lookup(), {"train"}),
               std::invalid_argument);
  EXPECT_THROW((void)resolve_config(json::object(), host_schema(), registry.lookup(), {"optim"}),
               std::invalid_argument);
}

TEST(ResolveConfig, LookupExceptionsPropagate) {
  FakeRegistry registry;
  const json raw = json::parse(R"({"loss":{"plugin":"nope"}})");
  try {
    (void)resolve_config(raw, host_schema(), registry.lookup(), {});
    FAIL() << "expected NoSuchPlugin";
  } catch (const NoSuchPlugin& e) {
    EXPECT_EQ(std::string(e.what()), "no loss plugin named 'nope'");
  }
  EXPECT_EQ(registry.calls, (std::vector<std::pair<std::string, std::string>>{{"loss", "nope"}}));
}

TEST(ResolveConfig, PluginSettingsAreValidatedWithTheOwnerInTheMessage) {
  ConfigError e = resolve_error(json::parse(R"({"loss":{"plugin":"kl","temperature":"hot"}})"));
  EXPECT_EQ(e.path(), "loss.temperature");
  EXPECT_EQ(std::string(e.what()),
            "loss.temperature: expected a number, got string \"hot\"; accepted: number > 0 "
            "(plugin loss 'kl' from /x/libkl.so)");
  e = resolve_error(json::parse(R"({"loss":{"plugin":"kl","temprature":2}})"));
  EXPECT_EQ(e.path(), "loss.temprature");
  EXPECT_CONTAINS(e.what(), "did you mean \"temperature\"?; accepted keys: reduction, temperature");
  e = resolve_error(json::parse(R"({"scheduler":{"plugin":"constant","warmup":10}})"));
  EXPECT_EQ(e.path(), "scheduler.warmup");
  EXPECT_CONTAINS(e.what(), "accepted keys: none (plugin scheduler 'constant' from /x/libsched.so)");
  e = resolve_error(json::parse(R"({"data":{"plugin":"jsonl"}})"));
  EXPECT_EQ(e.path(), "data.path");
  EXPECT_CONTAINS(e.what(), "missing required key");
}

TEST(ResolveConfig, BrokenPluginSchemasAreRefused) {
  FakeRegistry registry;
  try {
    (void)resolve_config(json::parse(R"({"drafter":{"plugin":"broken"}})"), host_schema(), registry.lookup(), {});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "invalid configuration schema of plugin drafter 'broken' from /x/libbroken.so: property \"k\": "
              "default -1 violates minimum 0");
  }
  try {
    (void)resolve_config(json::parse(R"({"target":{"plugin":"sneaky"}})"), host_schema(), registry.lookup(), {});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "property \"plugin\" is reserved");
  }
  EXPECT_THROW((void)resolve_config(json::object(), json{{"type", "string"}}, registry.lookup(), {}),
               std::invalid_argument);
}

}  // namespace
