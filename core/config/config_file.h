// Reading configuration files and applying `--set key.path=value` overrides.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config_schema.h"

namespace dflash::config {

// The deepest a configuration may nest, counting the top-level object as 1.
// Real configurations use a handful of levels; the limit keeps hostile input
// (100 000 nested arrays) from exhausting the stack in the recursive copies
// and walks that every nlohmann::json value goes through.
constexpr std::size_t kMaxNesting = 64;

// The largest configuration file read (bytes). Configurations are a few KiB;
// the cap stops a runaway file from being read into memory whole.
constexpr std::uintmax_t kMaxConfigBytes = std::uintmax_t{16} << 20;

// Reads a strict JSON file (no comments) whose top level is an object.
// Throws ConfigError (path() empty, or the key path for a duplicate key or a
// value nested too deeply) when the file is missing, unreadable, not a regular
// file (a FIFO, a device, a directory: refused without opening it), larger
// than kMaxConfigBytes, not valid JSON (the message gives the line and
// column), repeats a key within one object, nests deeper than kMaxNesting, or
// is not an object.
nlohmann::json load_json_file(const std::filesystem::path& file);

// Applies one `--set` assignment, `key.path=value`, to `root` (an object, or
// null which becomes one). The value is parsed as JSON when it parses and
// taken as a plain string otherwise. Missing intermediate objects are created;
// array elements are addressed as `layers[1]` and must exist. Throws
// ConfigError naming the whole assignment; path() is the key path concerned
// (empty when the assignment itself is malformed). The key path and the value
// together may nest at most kMaxNesting levels. `root` is unchanged on error.
void apply_override(nlohmann::json& root, const std::string& assignment);

}  // namespace dflash::config
