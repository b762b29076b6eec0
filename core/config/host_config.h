// The host's whole configuration: the "train" section (the host's own
// settings) and one section per plugin kind, each naming its plugin with the
// reserved key "plugin" and holding that plugin's settings.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config_schema.h"

namespace dflash::config {

struct PluginSchema {
  nlohmann::json schema;  // must pass check_schema
  std::string owner;      // e.g. "plugin loss 'kl' from /x/libkl.so"; appended to error messages
};

// Finds a plugin by section ("loss") and plugin name ("kl"). Whatever it throws
// when there is no such plugin propagates out of resolve_config unchanged.
using SchemaLookup = std::function<PluginSchema(const std::string& section, const std::string& plugin_name)>;

// {"data", "target", "drafter", "loss", "scheduler"}
const std::vector<std::string>& plugin_sections();

struct ResolvedConfig {
  // "train": the host settings with defaults filled (always present);
  // each chosen plugin section: {"plugin": name, ...the plugin's settings with defaults filled}.
  nlohmann::json root;
};

// Validates a whole configuration (null counts as {}). Throws ConfigError for
// problems in the user's configuration (unknown section, section not an
// object, no plugin chosen where one is needed, settings the schemas refuse);
// std::invalid_argument when host_train_schema or a plugin's schema is broken,
// or required_sections names something that is not a plugin section.
ResolvedConfig resolve_config(const nlohmann::json& raw, const nlohmann::json& host_train_schema,
                              const SchemaLookup& lookup, const std::vector<std::string>& required_sections);

// The config a plugin's create receives: its section without "plugin".
// Throws std::out_of_range when the section is not in the resolved config.
nlohmann::json plugin_config_of(const ResolvedConfig& resolved, const std::string& section);

}  // namespace dflash::config
