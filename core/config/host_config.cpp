#include "config/host_config.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace dflash::config {

using nlohmann::json;

namespace {

using detail::closest_match;
using detail::kind_of;
using detail::preview;

const char* const kHostOwner = "dflash-host";

std::string json_quote(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i > 0 ? sep : "") + parts[i];
  return out;
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

std::string got(const json& value) { return value.is_null() ? "null" : kind_of(value) + " " + preview(value); }

ConfigError no_plugin(const std::string& section, const std::string& detail) {
  const std::string path = section + ".plugin";
  return ConfigError(path, path + ": no " + section + " plugin chosen" + detail +
                               "; set \"plugin\" in the config or pass --" + section + " NAME");
}

}  // namespace

const std::vector<std::string>& plugin_sections() {
  static const std::vector<std::string> sections{"data", "target", "drafter", "loss", "scheduler"};
  return sections;
}

ResolvedConfig resolve_config(const json& raw, const json& host_train_schema, const SchemaLookup& lookup,
                              const std::vector<std::string>& required_sections) {
  check_schema(host_train_schema);
  for (const auto& section : required_sections) {
    if (!contains(plugin_sections(), section)) {
      throw std::invalid_argument("resolve_config: required section " + json_quote(section) +
                                  " is not a plugin section; expected one of " + join(plugin_sections(), ", "));
    }
  }

  const json input = raw.is_null() ? json::object() : raw;
  if (!input.is_object()) {
    throw ConfigError("", "(top level): expected an object, got " + got(input) +
                              "; accepted: object with sections train, " + join(plugin_sections(), ", "));
  }

  std::vector<std::string> allowed = plugin_sections();
  allowed.emplace_back("train");
  std::sort(allowed.begin(), allowed.end());
  for (const auto& item : input.items()) {
    if (contains(allowed, item.key())) continue;
    const std::string guess = closest_match(item.key(), allowed);
    throw ConfigError(item.key(), item.key() + ": unknown section" +
                                      (guess.empty() ? std::string() : ", did you mean " + json_quote(guess) + "?") +
                                      "; accepted sections: " + join(allowed, ", "));
  }

  ResolvedConfig out;
  out.root = json::object();
  const auto train = input.find("train");
  out.root["train"] =
      validate_and_fill(host_train_schema, train == input.end() ? json::object() : *train, "train", kHostOwner);

  for (const auto& section : plugin_sections()) {
    const bool required = contains(required_sections, section);
    const auto it = input.find(section);
    if (it == input.end()) {
      if (required) throw no_plugin(section, "");
      continue;
    }
    const json& body = *it;
    if (!body.is_object()) {
      const std::string example = body.is_string() && !body.get<std::string>().empty()
                                      ? "{\"plugin\": " + preview(body) + "}"
                                      : "{\"plugin\": \"NAME\"}";
      throw ConfigError(section, section + ": expected an object, got " + got(body) +
                                     "; accepted: object with \"plugin\" naming the " + section +
                                     " plugin and its settings, e.g. " + example);
    }
    std::string name;
    const auto plugin = body.find("plugin");
    if (plugin != body.end()) {
      if (!plugin->is_string()) throw no_plugin(section, " (expected a non-empty string, got " + got(*plugin) + ")");
      name = plugin->get<std::string>();
    }
    if (name.empty()) {
      const bool has_settings = body.size() > (plugin != body.end() ? 1U : 0U);
      if (has_settings || required) throw no_plugin(section, "");
      continue;  // an empty section is the same as an absent one
    }

    PluginSchema found = lookup(section, name);
    try {
      check_schema(found.schema);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("invalid configuration schema of " + found.owner + ": " + e.what());
    }
    if (const auto props = found.schema.find("properties");
        props != found.schema.end() && props->contains("plugin")) {
      throw std::invalid_argument("invalid configuration schema of " + found.owner +
                                  ": property \"plugin\" is reserved for choosing the plugin");
    }
    json settings = body;
    settings.erase("plugin");
    json filled = validate_and_fill(found.schema, settings, section, found.owner);
    filled["plugin"] = name;
    out.root[section] = std::move(filled);
  }
  return out;
}

json plugin_config_of(const ResolvedConfig& resolved, const std::string& section) {
  const auto it = resolved.root.find(section);
  if (it == resolved.root.end() || !it->is_object()) {
    throw std::out_of_range("plugin_config_of: section " + json_quote(section) + " is not in the resolved configuration");
  }
  json settings = *it;
  settings.erase("plugin");
  return settings;
}

}  // namespace dflash::config
