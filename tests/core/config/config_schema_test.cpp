#include "config/config_schema.h"

#include <dflash/sdk/schema.hpp>
#include <gtest/gtest.h>

#include "config_error.h"
#include "support/expect.h"

#include <cstdint>
#include <string>
#include <vector>

namespace {

using dflash::config::check_schema;
using dflash::config::ConfigError;
using dflash::config::defaults_of;
using dflash::config::describe_schema;
using dflash::config::validate_and_fill;
using nlohmann::json;


const char* const kOwner = "plugin loss 'kl' from /x/libkl.so";

json example_schema() {
  return json::parse(R"({
    "type": "object",
    "properties": {
      "temperature": {"type": "number", "default": 1.0, "exclusiveMinimum": 0, "description": "softmax temperature"},
      "reduction": {"type": "string", "enum": ["mean", "sum"], "default": "mean", "description": "how to reduce"},
      "chunk_size": {"type": "integer", "default": 0, "minimum": 0, "description": "0 = automatic"},
      "layers": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1, "maxItems": 4,
                 "default": [1, 2]},
      "optim": {"type": "object", "properties": {
        "beta1": {"type": "number", "default": 0.9, "minimum": 0, "maximum": 1, "description": "first moment"},
        "eps": {"type": "number", "exclusiveMaximum": 1}
      }},
      "name": {"type": "string"},
      "verbose": {"type": "boolean"}
    }
  })");
}


ConfigError fill_error(const json& value, const std::string& prefix = "loss") {
  return config_error([&] { (void)validate_and_fill(example_schema(), value, prefix, kOwner); });
}

std::string schema_error(const json& schema) {
  try {
    check_schema(schema);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "check_schema accepted " << schema.dump();
  return "<accepted>";
}

json with_property(const json& property) {
  return json{{"type", "object"}, {"properties", {{"p", property}}}};
}

// ---------------------------------------------------------------------------
// check_schema
// ---------------------------------------------------------------------------

TEST(CheckSchema, AcceptsTheExampleAndMinimalSchemas) {
  EXPECT_NO_THROW(check_schema(example_schema()));
  EXPECT_NO_THROW(check_schema(json{{"type", "object"}}));
  EXPECT_NO_THROW(check_schema(json::parse(R"({"type":"object","additionalProperties":true,
      "required":["a"],"properties":{"a":{"type":"array","items":{"type":"object",
      "properties":{"x":{"type":"integer","default":2}}}}}})")));
}

TEST(CheckSchema, RootMustBeAnObjectSchema) {
  EXPECT_CONTAINS(schema_error(json::array()), "schema root: a schema must be a JSON object, got array");
  EXPECT_EQ(schema_error(json{{"type", "array"}}), "schema root: type must be \"object\", got \"array\"");
  EXPECT_CONTAINS(schema_error(json{{"properties", json::object()}}), "schema root: missing \"type\"");
}

TEST(CheckSchema, DefaultViolatingItsOwnSchema) {
  json schema = example_schema();
  schema["properties"]["temperature"]["default"] = 0;
  EXPECT_EQ(schema_error(schema), "property \"temperature\": default 0 violates exclusiveMinimum 0");

  schema = example_schema();
  schema["properties"]["chunk_size"]["default"] = 1.5;
  EXPECT_EQ(schema_error(schema), "property \"chunk_size\": default 1.5 violates type \"integer\"");

  schema = example_schema();
  schema["properties"]["reduction"]["default"] = "avg";
  EXPECT_CONTAINS(schema_error(schema), "property \"reduction\": default \"avg\" violates enum [\"mean\",\"sum\"]");

  schema = example_schema();
  schema["properties"]["layers"]["default"] = json{1, -2};
  EXPECT_EQ(schema_error(schema), "property \"layers\": default [1,-2] violates minimum 0 at layers[1]");

  schema = example_schema();
  schema["properties"]["layers"]["default"] = json::array();
  EXPECT_EQ(schema_error(schema), "property \"layers\": default [] violates minItems 1");

  schema = example_schema();
  schema["properties"]["optim"]["default"] = json{{"beta1", 2}};
  EXPECT_EQ(schema_error(schema), "property \"optim\": default {\"beta1\":2} violates maximum 1 at optim.beta1");
}

TEST(CheckSchema, NestedPropertiesAreNamedByTheirPath) {
  json schema = example_schema();
  schema["properties"]["optim"]["properties"]["beta1"]["default"] = -0.5;
  EXPECT_EQ(schema_error(schema), "property \"optim.beta1\": default -0.5 violates minimum 0");

  schema = example_schema();
  schema["properties"]["layers"]["items"]["type"] = "int";
  EXPECT_CONTAINS(schema_error(schema), "property \"layers[]\": unknown type \"int\"");
}

TEST(CheckSchema, UnknownKeywordWithSuggestion) {
  const std::string msg = schema_error(with_property({{"type", "number"}, {"minimun", 0}}));
  EXPECT_CONTAINS(msg, "property \"p\": unknown keyword \"minimun\" (did you mean \"minimum\"?)");
  EXPECT_CONTAINS(msg, "supported: type, default");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "number"}, {"$comment", "x"}})),
                  "unknown keyword \"$comment\"; supported:");
}

TEST(CheckSchema, UnknownOrMalformedType) {
  EXPECT_CONTAINS(schema_error(with_property({{"type", "interger"}})),
                  "property \"p\": unknown type \"interger\" (did you mean \"integer\"?); expected one of boolean, "
                  "integer, number, string, array, object");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "float"}})), "unknown type \"float\"; expected one of");
  EXPECT_CONTAINS(schema_error(with_property({{"type", json{"number", "null"}}})),
                  "property \"p\": \"type\" must be a string, got array [\"number\",\"null\"]");
  EXPECT_CONTAINS(schema_error(with_property({{"default", 1}})), "property \"p\": missing \"type\"");
  EXPECT_CONTAINS(schema_error(with_property(json(3))), "property \"p\": a schema must be a JSON object, got integer 3");
}

TEST(CheckSchema, WrongKeywordTypes) {
  EXPECT_EQ(schema_error(with_property({{"type", "number"}, {"minimum", "0"}})),
            "property \"p\": \"minimum\" must be a number, got string \"0\"");
  EXPECT_EQ(schema_error(with_property({{"type", "number"}, {"exclusiveMaximum", true}})),
            "property \"p\": \"exclusiveMaximum\" must be a number, got boolean true");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "number"}, {"description", 5}})),
                  "\"description\" must be a string, got integer 5");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "array"}, {"minItems", -1}})),
                  "\"minItems\" must be a non-negative integer, got integer -1");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "array"}, {"maxItems", 1.5}})),
                  "\"maxItems\" must be a non-negative integer, got number 1.5");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "object"}, {"properties", json::array()}})),
                  "\"properties\" must be an object, got array");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "object"}, {"required", "a"}})),
                  "\"required\" must be an array of property names, got string \"a\"");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "object"}, {"required", json{1}}})),
                  "\"required\" must list property names (strings), got integer 1");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "object"}, {"additionalProperties", "no"}})),
                  "\"additionalProperties\" must be true or false, got string \"no\"");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "array"}, {"items", "integer"}})),
                  "property \"p[]\": a schema must be a JSON object, got string \"integer\"");
}

TEST(CheckSchema, KeywordThatDoesNotApplyToTheType) {
  EXPECT_EQ(schema_error(with_property({{"type", "string"}, {"minimum", 0}})),
            "property \"p\": keyword \"minimum\" does not apply to type \"string\"");
  EXPECT_EQ(schema_error(with_property({{"type", "number"}, {"items", {{"type", "number"}}}})),
            "property \"p\": keyword \"items\" does not apply to type \"number\"");
  EXPECT_EQ(schema_error(with_property({{"type", "array"}, {"properties", json::object()}})),
            "property \"p\": keyword \"properties\" does not apply to type \"array\"");
}

TEST(CheckSchema, EmptyRanges) {
  EXPECT_EQ(schema_error(with_property({{"type", "number"}, {"minimum", 5}, {"maximum", 1}})),
            "property \"p\": minimum 5 is greater than maximum 1");
  EXPECT_EQ(schema_error(with_property({{"type", "number"}, {"exclusiveMinimum", 1}, {"maximum", 1}})),
            "property \"p\": exclusiveMinimum 1 and maximum 1 leave no valid value");
  EXPECT_EQ(schema_error(with_property({{"type", "number"}, {"minimum", 2}, {"exclusiveMaximum", 2}})),
            "property \"p\": minimum 2 and exclusiveMaximum 2 leave no valid value");
  EXPECT_EQ(schema_error(with_property({{"type", "number"}, {"exclusiveMinimum", 0.5}, {"exclusiveMaximum", 0.5}})),
            "property \"p\": exclusiveMinimum 0.5 and exclusiveMaximum 0.5 leave no valid value");
  EXPECT_EQ(schema_error(with_property({{"type", "array"}, {"minItems", 3}, {"maxItems", 2}})),
            "property \"p\": minItems 3 is greater than maxItems 2");
  // Equal inclusive bounds are a valid (single-value) range.
  EXPECT_NO_THROW(check_schema(with_property({{"type", "number"}, {"minimum", 1}, {"maximum", 1}})));
}

TEST(CheckSchema, EnumRules) {
  EXPECT_EQ(schema_error(with_property({{"type", "string"}, {"enum", json::array()}})),
            "property \"p\": \"enum\" must be a non-empty array, got array []");
  EXPECT_EQ(schema_error(with_property({{"type", "string"}, {"enum", "a"}})),
            "property \"p\": \"enum\" must be a non-empty array, got string \"a\"");
  EXPECT_EQ(schema_error(with_property({{"type", "string"}, {"enum", json{"a", 1}}})),
            "property \"p\": enum value 1 violates type \"string\"");
  EXPECT_EQ(schema_error(with_property({{"type", "integer"}, {"minimum", 0}, {"enum", json{1, -1}}})),
            "property \"p\": enum value -1 violates minimum 0");
}

TEST(CheckSchema, RequiredAndPropertyNames) {
  EXPECT_EQ(schema_error(json::parse(R"({"type":"object","properties":{"a":{"type":"number"}},"required":["b"]})")),
            "schema root: \"required\" names \"b\", which is not in \"properties\"");
  EXPECT_EQ(schema_error(json::parse(R"({"type":"object","properties":{"a":{"type":"number"}},"required":["a","a"]})")),
            "schema root: \"required\" lists \"a\" twice");
  EXPECT_EQ(schema_error(json::parse(R"({"type":"object","properties":{"a.b":{"type":"number"}}})")),
            "schema root: property name \"a.b\" must not contain '.', '[', ']' or '='");
  EXPECT_EQ(schema_error(json::parse(R"({"type":"object","properties":{"":{"type":"number"}}})")),
            "schema root: property names must not be empty");
}

// ---------------------------------------------------------------------------
// validate_and_fill: defaults
// ---------------------------------------------------------------------------

TEST(ValidateAndFill, FillsAllDefaultsIntoAnEmptyObject) {
  const json filled = validate_and_fill(example_schema(), json::object(), "loss", kOwner);
  const json expected = json::parse(R"({"temperature":1.0,"reduction":"mean","chunk_size":0,"layers":[1,2],
                                        "optim":{"beta1":0.9}})");
  EXPECT_EQ(filled, expected);
  EXPECT_TRUE(filled["chunk_size"].is_number_integer());
}

TEST(ValidateAndFill, KeepsUserValuesAndFillsNestedDefaults) {
  const json value = json::parse(R"({"temperature":2.5,"layers":[7],"optim":{"eps":1e-8},"verbose":true})");
  const json filled = validate_and_fill(example_schema(), value, "loss", kOwner);
  EXPECT_EQ(filled["temperature"], 2.5);
  EXPECT_EQ(filled["layers"], json({7}));
  EXPECT_EQ(filled["optim"], json::parse(R"({"beta1":0.9,"eps":1e-8})"));
  EXPECT_EQ(filled["verbose"], true);
  EXPECT_FALSE(filled.contains("name"));  // no default, not required: stays absent
  EXPECT_EQ(value.size(), 4U);            // the input is not modified
}

TEST(ValidateAndFill, FillsDefaultsInsideArrayElementsAndObjectDefaults) {
  const json schema = json::parse(R"({"type":"object","properties":{
    "stages":{"type":"array","items":{"type":"object","properties":{
        "lr":{"type":"number","default":0.1},"steps":{"type":"integer"}}}},
    "sched":{"type":"object","default":{"warmup":5},"properties":{
        "warmup":{"type":"integer","default":0},"decay":{"type":"number","default":0.5}}},
    "empty":{"type":"object","properties":{"x":{"type":"integer"}}}
  }})");
  check_schema(schema);
  const json filled = validate_and_fill(schema, json::parse(R"({"stages":[{"steps":3},{"lr":1}]})"), "", "");
  EXPECT_EQ(filled["stages"], json::parse(R"([{"lr":0.1,"steps":3},{"lr":1}])"));
  EXPECT_EQ(filled["sched"], json::parse(R"({"warmup":5,"decay":0.5})"));
  EXPECT_FALSE(filled.contains("empty"));  // nothing inside has a default
}

TEST(ValidateAndFill, RequiredKeys) {
  const json schema = json::parse(R"({"type":"object","required":["model","steps"],"properties":{
      "model":{"type":"string","description":"path"},"steps":{"type":"integer","default":10,"minimum":1}}})");
  check_schema(schema);
  EXPECT_EQ(validate_and_fill(schema, json{{"model", "m"}}, "", ""), json::parse(R"({"model":"m","steps":10})"));
  const ConfigError e = config_error([&] { (void)validate_and_fill(schema, json::object(), "target", "T"); });
  EXPECT_EQ(e.path(), "target.model");
  EXPECT_EQ(std::string(e.what()), "target.model: missing required key; accepted: any string (T)");
}

TEST(ValidateAndFill, CreatedNestedObjectIsCheckedForRequiredKeys) {
  const json schema = json::parse(R"({"type":"object","properties":{"optim":{"type":"object","required":["lr"],
      "properties":{"lr":{"type":"number"},"beta1":{"type":"number","default":0.9}}}}})");
  check_schema(schema);
  const ConfigError e = config_error([&] { (void)validate_and_fill(schema, json::object(), "", ""); });
  EXPECT_EQ(e.path(), "optim.lr");
  EXPECT_CONTAINS(e.what(), "optim.lr: missing required key; accepted: any number");
}

TEST(ValidateAndFill, AdditionalPropertiesTrueKeepsUnknownKeys) {
  const json schema = json::parse(R"({"type":"object","additionalProperties":true,
      "properties":{"a":{"type":"integer","default":1}}})");
  EXPECT_EQ(validate_and_fill(schema, json{{"zz", "x"}}, "", ""), json::parse(R"({"a":1,"zz":"x"})"));
}

// ---------------------------------------------------------------------------
// validate_and_fill: errors
// ---------------------------------------------------------------------------

TEST(ValidateAndFill, WrongTypeMessageMatchesTheDocumentedFormat) {
  const ConfigError e = fill_error(json{{"temperature", "hot"}});
  EXPECT_EQ(e.path(), "loss.temperature");
  EXPECT_EQ(std::string(e.what()),
            "loss.temperature: expected a number, got string \"hot\"; accepted: number > 0 "
            "(plugin loss 'kl' from /x/libkl.so)");
}

TEST(ValidateAndFill, EmptyPrefixAndEmptyOwner) {
  const ConfigError e =
      config_error([] { (void)validate_and_fill(example_schema(), json{{"temperature", "hot"}}, "", ""); });
  EXPECT_EQ(e.path(), "temperature");
  EXPECT_EQ(std::string(e.what()), "temperature: expected a number, got string \"hot\"; accepted: number > 0");
}

TEST(ValidateAndFill, LongOffendingValuesAreTruncated) {
  const ConfigError e = fill_error(json{{"temperature", std::string(200, 'x')}});
  const std::string msg = e.what();
  EXPECT_CONTAINS(msg, "got string \"xxxx");
  EXPECT_CONTAINS(msg, "...; accepted: number > 0");
  EXPECT_LT(msg.size(), 180U);
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(ValidateAndFill, IntegerRejectsEveryNonIntegerNumber) {
  for (const json& v : {json(1.5), json(2.0), json(-0.0)}) {
    const ConfigError e = fill_error(json{{"chunk_size", v}});
    EXPECT_EQ(e.path(), "loss.chunk_size");
    EXPECT_CONTAINS(e.what(), "expected an integer, got number " + v.dump() + "; accepted: integer >= 0");
  }
  EXPECT_CONTAINS(fill_error(json{{"chunk_size", true}}).what(), "expected an integer, got boolean true");
  EXPECT_CONTAINS(fill_error(json{{"chunk_size", nullptr}}).what(), "expected an integer, got null");
  EXPECT_EQ(validate_and_fill(example_schema(), json{{"chunk_size", 4096}}, "", "")["chunk_size"], 4096);
}

TEST(ValidateAndFill, NumberAcceptsIntegers) {
  const json filled = validate_and_fill(example_schema(), json{{"temperature", 3}}, "", "");
  EXPECT_EQ(filled["temperature"], 3);
  EXPECT_TRUE(filled["temperature"].is_number_integer());
}

TEST(ValidateAndFill, ExclusiveAndInclusiveBounds) {
  ConfigError e = fill_error(json{{"temperature", 0}});
  EXPECT_EQ(e.path(), "loss.temperature");
  EXPECT_CONTAINS(e.what(), "loss.temperature: 0 is out of range, must be > 0; accepted: number > 0");
  EXPECT_NO_THROW((void)validate_and_fill(example_schema(), json{{"temperature", 1e-9}}, "", ""));

  e = fill_error(json{{"optim", {{"eps", 1}}}});
  EXPECT_EQ(e.path(), "loss.optim.eps");
  EXPECT_CONTAINS(e.what(), "1 is out of range, must be < 1; accepted: number < 1");
  EXPECT_NO_THROW((void)validate_and_fill(example_schema(), json{{"optim", {{"eps", 0.999}}}}, "", ""));

  e = fill_error(json{{"optim", {{"beta1", 1.01}}}});
  EXPECT_EQ(e.path(), "loss.optim.beta1");
  EXPECT_CONTAINS(e.what(), "1.01 is out of range, must be <= 1; accepted: number >= 0 and <= 1");
  EXPECT_NO_THROW((void)validate_and_fill(example_schema(), json{{"optim", {{"beta1", 1}}}}, "", ""));
  EXPECT_NO_THROW((void)validate_and_fill(example_schema(), json{{"optim", {{"beta1", 0}}}}, "", ""));

  e = fill_error(json{{"chunk_size", -1}});
  EXPECT_CONTAINS(e.what(), "-1 is out of range, must be >= 0");
}

// train.steps=18446744073709551615 passed "minimum 1" as a uint64 and was
// read as int64_t -1 ("nothing to do", exit 0). Every integer must fit
// int64_t, whatever the schema's bounds, in arrays too.
TEST(ValidateAndFill, IntegersBeyondInt64AreRefused) {
  const json too_big = json::parse("18446744073709551615");
  ConfigError e = fill_error(json{{"chunk_size", too_big}});
  EXPECT_EQ(e.path(), "loss.chunk_size");
  EXPECT_EQ(std::string(e.what()),
            "loss.chunk_size: 18446744073709551615 is out of range, must be <= 9223372036854775807 (a 64-bit "
            "integer); accepted: integer >= 0 (" + std::string(kOwner) + ")");
  e = fill_error(json{{"layers", {1, json::parse("9223372036854775808")}}});
  EXPECT_EQ(e.path(), "loss.layers[1]");
  EXPECT_CONTAINS(e.what(), "9223372036854775808 is out of range, must be <= 9223372036854775807");
  // The largest int64 is fine; so is a huge integer where any number is accepted.
  const json max = json::parse("9223372036854775807");
  EXPECT_EQ(validate_and_fill(example_schema(), json{{"chunk_size", max}}, "", "")["chunk_size"].get<int64_t>(),
            INT64_MAX);
  EXPECT_NO_THROW((void)validate_and_fill(example_schema(), json{{"temperature", too_big}}, "", ""));
}

// train.device "gpu" was accepted by `config` and died in LibTorch at train
// time; a string with "format": "device" is checked by the one rule.
TEST(ValidateAndFill, DeviceStringsAreCheckedByTheirFormat) {
  const json schema = json::parse(R"({"type":"object","properties":{
      "device":{"type":"string","format":"device","default":"cpu"}}})");
  auto device_error = [&](const std::string& device) {
    return std::string(config_error([&] {
      (void)validate_and_fill(schema, json{{"device", device}}, "train", "dflash-host");
    }).what());
  };
  EXPECT_EQ(device_error("gpu"), "train.device: \"gpu\" is not a device, did you mean \"cuda\"?; accepted: a "
                                 "device: cpu, cuda or cuda:N (dflash-host)");
  EXPECT_CONTAINS(device_error("GPU:1"), "did you mean \"cuda:1\"?");
  EXPECT_CONTAINS(device_error("CPU"), "\"CPU\" is not a device, did you mean \"cpu\"?");
  EXPECT_CONTAINS(device_error("cuda1"), "did you mean \"cuda:1\"?");
  EXPECT_CONTAINS(device_error("cpux"), "did you mean \"cpu\"?");
  for (const char* bad : {"cuda:", "cuda:01", "cuda:128", "cuda:-1", "cuda:1:2", "mps", "", " cpu"})
    EXPECT_CONTAINS(device_error(bad), "is not a device") << bad;
  EXPECT_EQ(device_error("xla").find("did you mean"), std::string::npos);
  for (const char* good : {"cpu", "cuda", "cuda:0", "cuda:7", "cuda:127"})
    EXPECT_EQ(validate_and_fill(schema, json{{"device", good}}, "", "")["device"], good);
  EXPECT_CONTAINS(describe_schema(schema, "train"), "device: cpu, cuda or cuda:N");

  EXPECT_EQ(schema_error(with_property({{"type", "string"}, {"format", "email"}})),
            "property \"p\": \"format\" must be one of device, got string \"email\"");
  EXPECT_EQ(schema_error(with_property({{"type", "integer"}, {"format", "device"}})),
            "property \"p\": keyword \"format\" does not apply to type \"integer\"");
  EXPECT_CONTAINS(schema_error(with_property({{"type", "string"}, {"format", "device"}, {"default", "gpu"}})),
                  "default \"gpu\" violates format \"device\"");
}

// The SDK writes the keyword, and integer bounds beyond int64 (a double cast
// to int64_t out of range is undefined) are clamped.
TEST(SdkSchema, DevicePropertiesAndHugeIntegerBounds) {
  const json schema = dflash::sdk::Schema()
                          .device("device", "cpu", "where it runs")
                          .integer("n", 1, "count", dflash::sdk::Bounds::between(-1e30, 1e30))
                          .json();
  EXPECT_NO_THROW(check_schema(schema));
  EXPECT_EQ(schema["properties"]["device"]["format"], "device");
  EXPECT_EQ(schema["properties"]["n"]["maximum"].get<int64_t>(), INT64_MAX);
  EXPECT_EQ(schema["properties"]["n"]["minimum"].get<int64_t>(), INT64_MIN);
  EXPECT_CONTAINS(config_error([&] { (void)validate_and_fill(schema, json{{"device", "gpu"}}, "x", ""); }).what(),
                  "x.device: \"gpu\" is not a device");
}

TEST(ValidateAndFill, EnumListsTheAllowedValues) {
  ConfigError e = fill_error(json{{"reduction", "avg"}});
  EXPECT_EQ(e.path(), "loss.reduction");
  EXPECT_EQ(std::string(e.what()),
            "loss.reduction: \"avg\" is not an allowed value; accepted: one of \"mean\", \"sum\" "
            "(plugin loss 'kl' from /x/libkl.so)");
  e = fill_error(json{{"reduction", "summ"}});
  EXPECT_CONTAINS(e.what(), "\"summ\" is not an allowed value, did you mean \"sum\"?");
  e = fill_error(json{{"reduction", 1}});
  EXPECT_CONTAINS(e.what(), "expected a string, got integer 1; accepted: one of \"mean\", \"sum\"");
}

TEST(ValidateAndFill, UnknownKeyWithDidYouMean) {
  const ConfigError e = fill_error(json{{"temprature", 2}});
  EXPECT_EQ(e.path(), "loss.temprature");
  EXPECT_EQ(std::string(e.what()),
            "loss.temprature: unknown key, did you mean \"temperature\"?; accepted keys: chunk_size, layers, name, "
            "optim, reduction, temperature, verbose (plugin loss 'kl' from /x/libkl.so)");
}

TEST(ValidateAndFill, UnknownKeySuggestionNeedsDistanceAtMostTwo) {
  EXPECT_CONTAINS(fill_error(json{{"tmeperature", 2}}).what(), "did you mean \"temperature\"?");  // swap = 1
  EXPECT_CONTAINS(fill_error(json{{"temperatur", 2}}).what(), "did you mean \"temperature\"?");   // 1
  EXPECT_CONTAINS(fill_error(json{{"tempratur", 2}}).what(), "did you mean \"temperature\"?");    // 2
  const ConfigError far = fill_error(json{{"tmpratur", 2}});                                      // 3
  EXPECT_NOT_CONTAINS(far.what(), "did you mean");
  EXPECT_CONTAINS(far.what(), "loss.tmpratur: unknown key; accepted keys: chunk_size");
}

TEST(ValidateAndFill, UnknownNestedKeyAndObjectWithoutProperties) {
  ConfigError e = fill_error(json{{"optim", {{"beta", 0.5}}}});
  EXPECT_EQ(e.path(), "loss.optim.beta");
  EXPECT_CONTAINS(e.what(), "unknown key, did you mean \"beta1\"?; accepted keys: beta1, eps");

  const json schema = json::parse(R"({"type":"object"})");
  e = config_error([&] { (void)validate_and_fill(schema, json{{"x", 1}}, "scheduler", "S"); });
  EXPECT_EQ(e.path(), "scheduler.x");
  EXPECT_EQ(std::string(e.what()), "scheduler.x: unknown key; accepted keys: none (S)");
}

TEST(ValidateAndFill, ArrayLengthAndElements) {
  ConfigError e = fill_error(json{{"layers", json::array()}});
  EXPECT_EQ(e.path(), "loss.layers");
  EXPECT_CONTAINS(e.what(),
                  "loss.layers: array has 0 items, expected at least 1; accepted: array of (integer >= 0) with 1 to 4 "
                  "items");
  e = fill_error(json{{"layers", {1, 2, 3, 4, 5}}});
  EXPECT_CONTAINS(e.what(), "array has 5 items, expected at most 4");
  e = fill_error(json{{"layers", {1, 2, -3}}});
  EXPECT_EQ(e.path(), "loss.layers[2]");
  EXPECT_CONTAINS(e.what(), "loss.layers[2]: -3 is out of range, must be >= 0; accepted: integer >= 0");
  e = fill_error(json{{"layers", {1, "2"}}});
  EXPECT_EQ(e.path(), "loss.layers[1]");
  EXPECT_CONTAINS(e.what(), "expected an integer, got string \"2\"");
  e = fill_error(json{{"layers", 3}});
  EXPECT_CONTAINS(e.what(), "expected an array, got integer 3");
}

TEST(ValidateAndFill, ValueThatIsNotAnObject) {
  ConfigError e = fill_error(json::array(), "loss");
  EXPECT_EQ(e.path(), "loss");
  EXPECT_CONTAINS(e.what(), "loss: expected an object, got array []; accepted: object with keys chunk_size");
  e = fill_error(json(5), "");
  EXPECT_EQ(e.path(), "");
  EXPECT_CONTAINS(e.what(), "(top level): expected an object, got integer 5");
}

TEST(ValidateAndFill, BooleanAndStringTypes) {
  EXPECT_CONTAINS(fill_error(json{{"verbose", "yes"}}).what(),
                  "loss.verbose: expected a boolean, got string \"yes\"; accepted: true or false");
  EXPECT_CONTAINS(fill_error(json{{"name", 1}}).what(), "loss.name: expected a string, got integer 1; accepted: any string");
}

// ---------------------------------------------------------------------------
// defaults_of / describe_schema / helpers
// ---------------------------------------------------------------------------

TEST(DefaultsOf, CollectsNestedDefaults) {
  EXPECT_EQ(defaults_of(example_schema()),
            json::parse(R"({"temperature":1.0,"reduction":"mean","chunk_size":0,"layers":[1,2],"optim":{"beta1":0.9}})"));
  EXPECT_EQ(defaults_of(example_schema()), validate_and_fill(example_schema(), json::object(), "", ""));
  EXPECT_EQ(defaults_of(json::parse(R"({"type":"object","properties":{"a":{"type":"string"}}})")), json::object());
}

TEST(DescribeSchema, OneAlignedLinePerLeafKey) {
  // optim is flattened into optim.beta1 and optim.eps; keys come out sorted.
  EXPECT_EQ(describe_schema(example_schema(), "loss"),
            "loss.chunk_size   integer         0       >= 0                     0 = automatic\n"
            "loss.layers       array<integer>  [1,2]   1 to 4 items, each >= 0\n"
            "loss.name         string          -       -\n"
            "loss.optim.beta1  number          0.9     >= 0, <= 1               first moment\n"
            "loss.optim.eps    number          -       < 1\n"
            "loss.reduction    string          \"mean\"  one of \"mean\"|\"sum\"      how to reduce\n"
            "loss.temperature  number          1.0     > 0                      softmax temperature\n"
            "loss.verbose      boolean         -       -\n");
}

TEST(DescribeSchema, RequiredKeysAndNoPrefix) {
  const json schema = json::parse(R"({"type":"object","required":["model"],"properties":{
      "model":{"type":"string","description":"model path"},
      "opt":{"type":"object","default":{"lr":0.5},"properties":{"lr":{"type":"number","default":0.1}}}}})");
  const std::string table = describe_schema(schema, "");
  EXPECT_CONTAINS(table, "model   string  (required)  -  model path\n");
  EXPECT_CONTAINS(table, "opt.lr  number  0.5");  // the object's default wins over the key's own
  EXPECT_EQ(describe_schema(json{{"type", "object"}}, "x"), "");
}

TEST(Helpers, ClosestMatchAndPreview) {
  using dflash::config::detail::closest_match;
  using dflash::config::detail::preview;
  EXPECT_EQ(closest_match("laers", {"layers", "loss"}), "layers");
  EXPECT_EQ(closest_match("sl", {"lr"}), "");  // distance 2 is not below the length of "lr"
  EXPECT_EQ(closest_match("abc", {}), "");
  EXPECT_EQ(preview(json("abc")), "\"abc\"");
  EXPECT_EQ(preview(json(std::string(100, 'a')), 10), "\"aaaaaa...");
}

}  // namespace
