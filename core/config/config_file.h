// Reading configuration files and applying `--set key.path=value` overrides.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config_schema.h"

namespace dflash::config {

// Reads a strict JSON file (no comments) whose top level is an object.
// Throws ConfigError (path() empty, or the key path for a duplicate key) when
// the file is missing or unreadable, is not valid JSON (the message gives the
// line and column), repeats a key within one object, or is not an object.
nlohmann::json load_json_file(const std::filesystem::path& file);

// Applies one `--set` assignment, `key.path=value`, to `root` (an object, or
// null which becomes one). The value is parsed as JSON when it parses and
// taken as a plain string otherwise. Missing intermediate objects are created;
// array elements are addressed as `layers[1]` and must exist. Throws
// ConfigError naming the whole assignment; path() is the key path concerned
// (empty when the assignment itself is malformed). `root` is unchanged on error.
void apply_override(nlohmann::json& root, const std::string& assignment);

}  // namespace dflash::config
