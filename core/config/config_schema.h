// Configuration schemas: a small subset of JSON Schema that plugins (and the
// host itself) use to declare their settings, and the validator that checks a
// user's configuration against it and fills in defaults.
//
// Supported keywords: type, default, description, minimum, maximum,
// exclusiveMinimum, exclusiveMaximum (numbers, draft-6 style), enum, items,
// minItems, maxItems, properties, required, additionalProperties (boolean,
// FALSE when absent), format (strings; only "device": cpu, cuda or cuda:N),
// memoryKnob. Integers must fit int64_t whatever the bounds say. See
// docs/config.md for the full rules.
//
// All APIs use nlohmann::json (keys are kept sorted).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash::config {

// A problem in the user's configuration. what() is one line of the form
//   <path>: <problem>; <what is accepted> (<owner>)
// and path() is the dotted JSON path of the offending value, array elements
// written as `layers[2]` (empty when the problem is not tied to a value, e.g.
// a file that cannot be read).
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string path, const std::string& message);
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

// Checks a schema itself. The root must be an object schema ("type":
// "object"). Throws std::invalid_argument naming the property and the problem,
// e.g. `property "temperature": default 0 violates exclusiveMinimum 0`.
void check_schema(const nlohmann::json& schema);

// Validates `value` against `schema` (which must pass check_schema) and
// returns a copy with every missing key that has a default filled in,
// recursively; a missing nested object is created when something inside it has
// a default. Throws ConfigError on the first problem. `path_prefix` is put in
// front of every path ("loss" -> "loss.temperature"); `owner` is appended to
// messages verbatim in parentheses (omitted when empty).
nlohmann::json validate_and_fill(const nlohmann::json& schema, const nlohmann::json& value,
                                 const std::string& path_prefix, const std::string& owner);

// A human-readable table, one line per leaf key, columns aligned:
//   key.path  type  default  constraints  description
// Nested objects are flattened with dots; keys are prefixed with
// `path_prefix.` when it is not empty. Empty string when there are no keys.
std::string describe_schema(const nlohmann::json& schema, const std::string& path_prefix);

// The object of all defaults the schema declares (nested objects included when
// something inside them has a default). Always an object.
nlohmann::json defaults_of(const nlohmann::json& schema);

// Small helpers shared by the config module (not a stable API).
namespace detail {
// The candidate closest to `word` by edit distance (adjacent transpositions
// count as one edit) when that distance is at most 2 and smaller than the
// candidate's length; empty string otherwise.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);
// `value` as one line of compact JSON, cut to at most `max_chars` characters
// (ending in "...") when longer.
std::string preview(const nlohmann::json& value, std::size_t max_chars = 60);
// "null", "boolean", "integer", "number", "string", "array" or "object".
std::string kind_of(const nlohmann::json& value);
}  // namespace detail

}  // namespace dflash::config
