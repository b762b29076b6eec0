#include "config/config_schema.h"

#include "config/device_name.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace dflash::config {

using nlohmann::json;

ConfigError::ConfigError(std::string path, const std::string& message)
    : std::runtime_error(message), path_(std::move(path)) {}

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------
namespace detail {
namespace {

// Optimal string alignment distance: insertions, deletions, substitutions and
// swaps of two adjacent characters each cost one.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1, 0));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

}  // namespace

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = 3;  // only distances <= 2 qualify
  for (const auto& candidate : candidates) {
    const std::size_t d = edit_distance(word, candidate);
    if (d < best_distance && d < candidate.size()) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

std::string preview(const json& value, std::size_t max_chars) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() <= max_chars) return text;
  std::size_t keep = max_chars >= 3 ? max_chars - 3 : 0;
  // Do not cut a UTF-8 sequence in half.
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0U) == 0x80U) --keep;
  text.resize(keep);
  return text + "...";
}

std::string kind_of(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

}  // namespace detail

namespace {

using detail::closest_match;
using detail::kind_of;
using detail::preview;

const std::vector<std::string>& known_types() {
  static const std::vector<std::string> types{"boolean", "integer", "number", "string", "array", "object"};
  return types;
}

const std::vector<std::string>& known_keywords() {
  static const std::vector<std::string> keywords{
      "type", "default", "description", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum",
      "items", "minItems", "maxItems", "properties", "required", "additionalProperties", "memoryKnob", "format"};
  return keywords;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

std::string json_quote(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

std::string join_key(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// Puts a relative JSON path ("a.b", "[2]", "") after a prefix.
std::string combine(const std::string& prefix, const std::string& rel) {
  if (prefix.empty()) return rel;
  if (rel.empty()) return prefix;
  if (rel.front() == '[') return prefix + rel;
  return prefix + "." + rel;
}

// "string \"hot\"", "integer 3", "null".
std::string got(const json& value) {
  if (value.is_null()) return "null";
  return kind_of(value) + " " + preview(value);
}

std::string with_article(const std::string& type) {
  if (type == "integer" || type == "array" || type == "object") return "an " + type;
  return "a " + type;
}

// The schema's type name, or "" when it declares none (anything matches).
std::string schema_type(const json& node) {
  if (!node.is_object()) return "";
  auto it = node.find("type");
  if (it == node.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

const json* keyword(const json& node, const char* name) {
  if (!node.is_object()) return nullptr;
  auto it = node.find(name);
  return it == node.end() ? nullptr : &*it;
}

// The string formats a schema may name; each is checked by one function.
const std::vector<std::string>& known_formats() {
  static const std::vector<std::string> formats{"device"};
  return formats;
}

bool is_device_format(const json& node) {
  const json* f = keyword(node, "format");
  return f != nullptr && f->is_string() && f->get<std::string>() == "device";
}

const json* properties_of(const json& node) {
  const json* props = keyword(node, "properties");
  return props != nullptr && props->is_object() ? props : nullptr;
}

std::vector<std::string> property_names(const json& node) {
  std::vector<std::string> names;
  if (const json* props = properties_of(node)) {
    for (const auto& item : props->items()) names.push_back(item.key());
  }
  return names;
}

std::set<std::string> required_names(const json& node) {
  std::set<std::string> names;
  const json* req = keyword(node, "required");
  if (req != nullptr && req->is_array()) {
    for (const auto& r : *req) {
      if (r.is_string()) names.insert(r.get<std::string>());
    }
  }
  return names;
}

bool allows_additional(const json& node) {
  const json* add = keyword(node, "additionalProperties");
  return add != nullptr && add->is_boolean() && add->get<bool>();
}

bool type_matches(const std::string& type, const json& value) {
  if (type.empty()) return true;
  if (type == "boolean") return value.is_boolean();
  if (type == "integer") return value.is_number_integer();
  if (type == "number") return value.is_number();
  if (type == "string") return value.is_string();
  if (type == "array") return value.is_array();
  if (type == "object") return value.is_object();
  return false;
}

// Exact for every JSON integer on platforms where long double has a 64-bit
// mantissa or more; good enough everywhere else.
long double as_number(const json& v) {
  if (v.is_number_unsigned()) return static_cast<long double>(v.get<std::uint64_t>());
  if (v.is_number_integer()) return static_cast<long double>(v.get<std::int64_t>());
  return static_cast<long double>(v.get<double>());
}

const json* numeric_keyword(const json& node, const char* name) {
  const json* k = keyword(node, name);
  return k != nullptr && k->is_number() ? k : nullptr;
}

const json* count_keyword(const json& node, const char* name) {
  const json* k = keyword(node, name);
  return k != nullptr && k->is_number_integer() ? k : nullptr;
}

// ">= 0", "> 0 and <= 1", ... ; empty when unbounded.
std::vector<std::string> bound_parts(const json& node) {
  std::vector<std::string> parts;
  if (const json* b = numeric_keyword(node, "minimum")) parts.push_back(">= " + b->dump());
  if (const json* b = numeric_keyword(node, "exclusiveMinimum")) parts.push_back("> " + b->dump());
  if (const json* b = numeric_keyword(node, "maximum")) parts.push_back("<= " + b->dump());
  if (const json* b = numeric_keyword(node, "exclusiveMaximum")) parts.push_back("< " + b->dump());
  return parts;
}

std::string items_count_phrase(const json& node) {
  const json* lo = count_keyword(node, "minItems");
  const json* hi = count_keyword(node, "maxItems");
  auto items = [](const json& n) { return n.dump() + (as_number(n) == 1 ? " item" : " items"); };
  if (lo != nullptr && hi != nullptr) {
    if (*lo == *hi) return "exactly " + items(*lo);
    return lo->dump() + " to " + items(*hi);
  }
  if (lo != nullptr) return "at least " + items(*lo);
  if (hi != nullptr) return "at most " + items(*hi);
  return "";
}

std::string enum_list(const json& values, const std::string& sep) {
  std::vector<std::string> shown;
  for (const auto& v : values) shown.push_back(preview(v, 40));
  return join(shown, sep);
}

// What a value at `node` may be, e.g. "number > 0", "one of \"mean\", \"sum\"".
std::string describe_value(const json& node) {
  if (const json* e = keyword(node, "enum"); e != nullptr && e->is_array()) {
    return "one of " + enum_list(*e, ", ");
  }
  const std::string type = schema_type(node);
  if (type.empty()) return "any value";
  if (type == "boolean") return "true or false";
  if (type == "string") return is_device_format(node) ? std::string("a device: ") + kDeviceNames : "any string";
  if (type == "integer" || type == "number") {
    const auto parts = bound_parts(node);
    return parts.empty() ? "any " + type : type + " " + join(parts, " and ");
  }
  if (type == "array") {
    std::string out = "array";
    if (const json* items = keyword(node, "items"); items != nullptr && items->is_object()) {
      const std::string inner = describe_value(*items);
      out += inner.find(' ') == std::string::npos ? " of " + inner : " of (" + inner + ")";
    }
    const std::string count = items_count_phrase(node);
    if (!count.empty()) out += " with " + count;
    return out;
  }
  // object
  if (allows_additional(node)) return "object (any keys)";
  const auto names = property_names(node);
  if (names.empty()) return "empty object";
  return "object with keys " + join(names, ", ");
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

// A violation found by fill_node(); converted to ConfigError or invalid_argument by
// the public entry points.
struct Violation {
  std::string path;      // relative JSON path
  std::string problem;   // "expected a number, got string \"hot\""
  std::string accepted;  // "accepted: number > 0"
  std::string rule;      // "exclusiveMinimum 0" (for schema checks)
};

[[noreturn]] void fail(const std::string& path, std::string problem, std::string accepted, std::string rule) {
  throw Violation{path, std::move(problem), std::move(accepted), std::move(rule)};
}

std::string accepted_for(const json& node) { return "accepted: " + describe_value(node); }

std::optional<json> default_value(const json& node);

// Adds the defaults declared under `node` to `value` where missing; no checks.
json merge_defaults(const json& node, json value) {
  const std::string type = schema_type(node);
  if (type == "object" && value.is_object()) {
    if (const json* props = properties_of(node)) {
      for (const auto& item : props->items()) {
        auto it = value.find(item.key());
        if (it != value.end()) {
          *it = merge_defaults(item.value(), *it);
        } else if (auto d = default_value(item.value())) {
          value[item.key()] = std::move(*d);
        }
      }
    }
  } else if (type == "array" && value.is_array()) {
    if (const json* items = keyword(node, "items"); items != nullptr && items->is_object()) {
      for (auto& element : value) element = merge_defaults(*items, element);
    }
  }
  return value;
}

// The value a missing key at `node` takes, if any.
std::optional<json> default_value(const json& node) {
  if (const json* d = keyword(node, "default")) return merge_defaults(node, *d);
  if (schema_type(node) == "object") {
    json created = merge_defaults(node, json::object());
    if (!created.empty()) return created;
  }
  return std::nullopt;
}

void check_bounds(const json& node, const json& value, const std::string& path) {
  const long double v = as_number(value);
  auto out_of_range = [&](const char* kw, const char* op, const json& bound) {
    fail(path, preview(value) + " is out of range, must be " + op + " " + bound.dump(), accepted_for(node),
         std::string(kw) + " " + bound.dump());
  };
  if (const json* b = numeric_keyword(node, "minimum"); b != nullptr && !(v >= as_number(*b))) {
    out_of_range("minimum", ">=", *b);
  }
  if (const json* b = numeric_keyword(node, "exclusiveMinimum"); b != nullptr && !(v > as_number(*b))) {
    out_of_range("exclusiveMinimum", ">", *b);
  }
  if (const json* b = numeric_keyword(node, "maximum"); b != nullptr && !(v <= as_number(*b))) {
    out_of_range("maximum", "<=", *b);
  }
  if (const json* b = numeric_keyword(node, "exclusiveMaximum"); b != nullptr && !(v < as_number(*b))) {
    out_of_range("exclusiveMaximum", "<", *b);
  }
}

// Every integer setting is read as int64_t (plugins included): a JSON integer
// above INT64_MAX (nlohmann keeps it as uint64_t) would wrap to a negative
// value there, so it is refused here whatever the schema's bounds say.
void check_int64(const json& node, const json& value, const std::string& path) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  if (value.is_number_unsigned() && value.get<std::uint64_t>() > static_cast<std::uint64_t>(kMax)) {
    fail(path, preview(value) + " is out of range, must be <= " + std::to_string(kMax) + " (a 64-bit integer)",
         accepted_for(node), "int64 range");
  }
}

void check_device(const json& node, const std::string& value, const std::string& path) {
  if (is_device_name(value)) return;
  const std::string guess = device_name_hint(value);
  fail(path, preview(json(value)) + " is not a device" + (guess.empty() ? std::string() : ", did you mean " + json_quote(guess) + "?"),
       accepted_for(node), "format \"device\"");
}

json fill_node(const json& node, const json& value, const std::string& path);

json fill_array(const json& node, const json& value, const std::string& path) {
  const std::size_t n = value.size();
  auto count = [](std::size_t c) { return std::to_string(c) + (c == 1 ? " item" : " items"); };
  if (const json* lo = count_keyword(node, "minItems"); lo != nullptr && as_number(*lo) > n) {
    fail(path, "array has " + count(n) + ", expected at least " + lo->dump(), accepted_for(node),
         "minItems " + lo->dump());
  }
  if (const json* hi = count_keyword(node, "maxItems"); hi != nullptr && as_number(*hi) < n) {
    fail(path, "array has " + count(n) + ", expected at most " + hi->dump(), accepted_for(node),
         "maxItems " + hi->dump());
  }
  const json* items = keyword(node, "items");
  if (items == nullptr || !items->is_object()) return value;
  json out = json::array();
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(fill_node(*items, value[i], path + "[" + std::to_string(i) + "]"));
  }
  return out;
}

json fill_object(const json& node, const json& value, const std::string& path) {
  const json* props = properties_of(node);
  if (!allows_additional(node)) {
    for (const auto& item : value.items()) {
      if (props != nullptr && props->contains(item.key())) continue;
      const auto names = property_names(node);
      const std::string guess = closest_match(item.key(), names);
      fail(join_key(path, item.key()),
           "unknown key" + (guess.empty() ? std::string() : ", did you mean " + json_quote(guess) + "?"),
           "accepted keys: " + (names.empty() ? std::string("none") : join(names, ", ")),
           "additionalProperties false (unknown key " + json_quote(item.key()) + ")");
    }
  }
  const std::set<std::string> required = required_names(node);
  json out = value;
  if (props != nullptr) {
    for (const auto& item : props->items()) {
      const std::string& key = item.key();
      const json& child = item.value();
      const std::string child_path = join_key(path, key);
      auto it = value.find(key);
      if (it != value.end()) {
        out[key] = fill_node(child, *it, child_path);
      } else if (const json* d = keyword(child, "default")) {
        out[key] = fill_node(child, *d, child_path);
      } else if (required.count(key) != 0) {
        fail(child_path, "missing required key", accepted_for(child), "required (missing " + json_quote(key) + ")");
      } else if (schema_type(child) == "object" && default_value(child).has_value()) {
        out[key] = fill_node(child, json::object(), child_path);
      }
    }
  }
  for (const auto& key : required) {  // names outside "properties" (unchecked schemas)
    if (!out.contains(key)) {
      fail(join_key(path, key), "missing required key", "accepted: any value", "required (missing " + json_quote(key) + ")");
    }
  }
  return out;
}

json fill_node(const json& node, const json& value, const std::string& path) {
  const std::string type = schema_type(node);
  if (!type_matches(type, value)) {
    fail(path, "expected " + with_article(type) + ", got " + got(value), accepted_for(node), "type " + json_quote(type));
  }
  if (const json* e = keyword(node, "enum"); e != nullptr && e->is_array()) {
    if (std::find(e->begin(), e->end(), value) == e->end()) {
      std::string problem = preview(value) + " is not an allowed value";
      if (value.is_string()) {
        std::vector<std::string> options;
        for (const auto& option : *e) {
          if (option.is_string()) options.push_back(option.get<std::string>());
        }
        const std::string guess = closest_match(value.get<std::string>(), options);
        if (!guess.empty()) problem += ", did you mean " + json_quote(guess) + "?";
      }
      fail(path, problem, accepted_for(node), "enum " + preview(*e));
    }
  }
  if (type == "integer") check_int64(node, value, path);
  if (value.is_number() && (type == "integer" || type == "number")) check_bounds(node, value, path);
  if (is_device_format(node) && value.is_string()) check_device(node, value.get<std::string>(), path);
  if (type == "array") return fill_array(node, value, path);
  if (type == "object") return fill_object(node, value, path);
  return value;
}

// ---------------------------------------------------------------------------
// Schema checks
// ---------------------------------------------------------------------------

std::string label_of(const std::string& name) {
  return name.empty() ? "schema root" : "property " + json_quote(name);
}

[[noreturn]] void bad(const std::string& name, const std::string& problem) {
  throw std::invalid_argument(label_of(name) + ": " + problem);
}

bool applies_to(const std::string& kw, const std::string& type) {
  if (kw == "type" || kw == "default" || kw == "description" || kw == "enum") return true;
  if (kw == "minimum" || kw == "maximum" || kw == "exclusiveMinimum" || kw == "exclusiveMaximum") {
    return type == "integer" || type == "number";
  }
  if (kw == "items" || kw == "minItems" || kw == "maxItems") return type == "array";
  if (kw == "memoryKnob") return type == "integer";
  if (kw == "format") return type == "string";
  return type == "object";  // properties, required, additionalProperties
}

void check_node(const json& node, const std::string& name) {
  if (!node.is_object()) bad(name, "a schema must be a JSON object, got " + got(node));

  for (const auto& item : node.items()) {
    const auto& kws = known_keywords();
    if (std::find(kws.begin(), kws.end(), item.key()) != kws.end()) continue;
    const std::string guess = closest_match(item.key(), kws);
    bad(name, "unknown keyword " + json_quote(item.key()) +
                  (guess.empty() ? std::string() : " (did you mean " + json_quote(guess) + "?)") +
                  "; supported: " + join(kws, ", "));
  }

  const json* t = keyword(node, "type");
  if (t == nullptr) bad(name, "missing \"type\"; expected one of " + join(known_types(), ", "));
  if (!t->is_string()) bad(name, "\"type\" must be a string, got " + got(*t));
  const std::string type = t->get<std::string>();
  if (std::find(known_types().begin(), known_types().end(), type) == known_types().end()) {
    const std::string guess = closest_match(type, known_types());
    bad(name, "unknown type " + json_quote(type) +
                  (guess.empty() ? std::string() : " (did you mean " + json_quote(guess) + "?)") +
                  "; expected one of " + join(known_types(), ", "));
  }
  if (name.empty() && type != "object") bad(name, "type must be \"object\", got " + json_quote(type));

  if (const json* knob = keyword(node, "memoryKnob"); knob != nullptr && (!knob->is_string() || knob->get<std::string>().empty()))
    bad(name, "\"memoryKnob\" must be a non-empty string (the knob's label, e.g. \"token budget\"), got " + got(*knob));
  for (const auto& item : node.items()) {
    if (!applies_to(item.key(), type)) {
      bad(name, "keyword " + json_quote(item.key()) + " does not apply to type " + json_quote(type));
    }
  }

  if (const json* f = keyword(node, "format")) {
    const auto& formats = known_formats();
    if (!f->is_string() || std::find(formats.begin(), formats.end(), f->get<std::string>()) == formats.end()) {
      bad(name, "\"format\" must be one of " + join(formats, ", ") + ", got " + got(*f));
    }
  }

  if (const json* d = keyword(node, "description"); d != nullptr && !d->is_string()) {
    bad(name, "\"description\" must be a string, got " + got(*d));
  }

  // Numeric bounds.
  for (const char* kw : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    if (const json* b = keyword(node, kw); b != nullptr && !b->is_number()) {
      bad(name, json_quote(kw) + " must be a number, got " + got(*b));
    }
  }
  const json* min = keyword(node, "minimum");
  const json* max = keyword(node, "maximum");
  const json* xmin = keyword(node, "exclusiveMinimum");
  const json* xmax = keyword(node, "exclusiveMaximum");
  if (min != nullptr && max != nullptr && as_number(*min) > as_number(*max)) {
    bad(name, "minimum " + min->dump() + " is greater than maximum " + max->dump());
  }
  auto empty_range = [&](const char* lo_kw, const json* lo, const char* hi_kw, const json* hi) {
    if (lo != nullptr && hi != nullptr && as_number(*lo) >= as_number(*hi)) {
      bad(name, std::string(lo_kw) + " " + lo->dump() + " and " + hi_kw + " " + hi->dump() +
                    " leave no valid value");
    }
  };
  empty_range("exclusiveMinimum", xmin, "maximum", max);
  empty_range("minimum", min, "exclusiveMaximum", xmax);
  empty_range("exclusiveMinimum", xmin, "exclusiveMaximum", xmax);

  // Array keywords.
  for (const char* kw : {"minItems", "maxItems"}) {
    const json* c = keyword(node, kw);
    if (c != nullptr && !(c->is_number_integer() && (c->is_number_unsigned() || c->get<std::int64_t>() >= 0))) {
      bad(name, json_quote(kw) + " must be a non-negative integer, got " + got(*c));
    }
  }
  const json* min_items = keyword(node, "minItems");
  const json* max_items = keyword(node, "maxItems");
  if (min_items != nullptr && max_items != nullptr && as_number(*min_items) > as_number(*max_items)) {
    bad(name, "minItems " + min_items->dump() + " is greater than maxItems " + max_items->dump());
  }
  if (const json* items = keyword(node, "items")) check_node(*items, name + "[]");

  // Object keywords.
  if (const json* props = keyword(node, "properties")) {
    if (!props->is_object()) bad(name, "\"properties\" must be an object, got " + got(*props));
    for (const auto& item : props->items()) {
      const std::string& key = item.key();
      if (key.empty()) bad(name, "property names must not be empty");
      if (key.find_first_of(".[]=") != std::string::npos) {
        bad(name, "property name " + json_quote(key) + " must not contain '.', '[', ']' or '='");
      }
      check_node(item.value(), join_key(name, key));
    }
  }
  if (const json* req = keyword(node, "required")) {
    if (!req->is_array()) bad(name, "\"required\" must be an array of property names, got " + got(*req));
    std::set<std::string> seen;
    for (const auto& r : *req) {
      if (!r.is_string()) bad(name, "\"required\" must list property names (strings), got " + got(r));
      const std::string key = r.get<std::string>();
      const json* props = properties_of(node);
      if (props == nullptr || !props->contains(key)) {
        bad(name, "\"required\" names " + json_quote(key) + ", which is not in \"properties\"");
      }
      if (!seen.insert(key).second) bad(name, "\"required\" lists " + json_quote(key) + " twice");
    }
  }
  if (const json* add = keyword(node, "additionalProperties"); add != nullptr && !add->is_boolean()) {
    bad(name, "\"additionalProperties\" must be true or false, got " + got(*add));
  }

  // Values: enum entries and the default must satisfy the schema.
  if (const json* e = keyword(node, "enum")) {
    if (!e->is_array() || e->empty()) bad(name, "\"enum\" must be a non-empty array, got " + got(*e));
    for (const auto& option : *e) {
      try {
        fill_node(node, option, "");
      } catch (const Violation& v) {
        bad(name, "enum value " + preview(option) + " violates " + v.rule +
                      (v.path.empty() ? std::string() : " at " + combine(name, v.path)));
      }
    }
  }
  if (const json* d = keyword(node, "default")) {
    try {
      fill_node(node, *d, "");
    } catch (const Violation& v) {
      bad(name, "default " + preview(*d) + " violates " + v.rule +
                    (v.path.empty() ? std::string() : " at " + combine(name, v.path)));
    }
  }
}

// ---------------------------------------------------------------------------
// Description table
// ---------------------------------------------------------------------------

struct Row {
  std::string key, type, def, constraints, description;
};

std::string type_label(const json& node) {
  const std::string type = schema_type(node);
  if (type == "array") {
    if (const json* items = keyword(node, "items"); items != nullptr && items->is_object()) {
      return "array<" + type_label(*items) + ">";
    }
  }
  return type.empty() ? "any" : type;
}

std::string constraint_text(const json& node) {
  std::vector<std::string> parts;
  if (const json* e = keyword(node, "enum"); e != nullptr && e->is_array()) {
    parts.push_back("one of " + enum_list(*e, "|"));
  }
  const auto bounds = bound_parts(node);
  parts.insert(parts.end(), bounds.begin(), bounds.end());
  const std::string type = schema_type(node);
  if (type == "array") {
    const std::string count = items_count_phrase(node);
    if (!count.empty()) parts.push_back(count);
    if (const json* items = keyword(node, "items"); items != nullptr && items->is_object()) {
      const std::string inner = constraint_text(*items);
      if (!inner.empty()) parts.push_back("each " + inner);
    }
  }
  if (type == "object" && allows_additional(node)) parts.push_back("any keys");
  if (is_device_format(node)) parts.push_back(std::string("device: ") + kDeviceNames);
  return join(parts, ", ");
}

void collect_rows(const json& node, const std::string& key, bool required, const std::optional<json>& eff,
                  std::vector<Row>& rows) {
  const json* props = properties_of(node);
  if (schema_type(node) == "object" && props != nullptr && !props->empty()) {
    const auto req = required_names(node);
    for (const auto& item : props->items()) {
      std::optional<json> child_default;
      if (eff.has_value() && eff->is_object() && eff->contains(item.key())) child_default = eff->at(item.key());
      collect_rows(item.value(), join_key(key, item.key()), req.count(item.key()) != 0, child_default, rows);
    }
    return;
  }
  Row row;
  row.key = key;
  row.type = type_label(node);
  if (eff.has_value()) {
    row.def = preview(*eff, 40);
  } else {
    row.def = required ? "(required)" : "-";
  }
  row.constraints = constraint_text(node);
  if (row.constraints.empty()) row.constraints = "-";
  if (const json* d = keyword(node, "description"); d != nullptr && d->is_string()) {
    row.description = d->get<std::string>();
  }
  rows.push_back(std::move(row));
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

void check_schema(const json& schema) { check_node(schema, ""); }

json validate_and_fill(const json& schema, const json& value, const std::string& path_prefix,
                       const std::string& owner) {
  try {
    return fill_node(schema, value, "");
  } catch (const Violation& v) {
    const std::string path = combine(path_prefix, v.path);
    std::string message = (path.empty() ? std::string("(top level)") : path) + ": " + v.problem + "; " + v.accepted;
    if (!owner.empty()) message += " (" + owner + ")";
    throw ConfigError(path, message);
  }
}

std::string describe_schema(const json& schema, const std::string& path_prefix) {
  std::vector<Row> rows;
  const json* props = properties_of(schema);
  if (props == nullptr || props->empty()) return "";
  collect_rows(schema, path_prefix, false, default_value(schema), rows);

  std::size_t w_key = 0, w_type = 0, w_def = 0, w_con = 0;
  for (const auto& r : rows) {
    w_key = std::max(w_key, r.key.size());
    w_type = std::max(w_type, r.type.size());
    w_def = std::max(w_def, r.def.size());
    w_con = std::max(w_con, r.constraints.size());
  }
  auto pad = [](const std::string& s, std::size_t w) { return s + std::string(w - s.size(), ' '); };
  std::string out;
  for (const auto& r : rows) {
    std::string line = pad(r.key, w_key) + "  " + pad(r.type, w_type) + "  " + pad(r.def, w_def) + "  " +
                       pad(r.constraints, w_con) + "  " + r.description;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

json defaults_of(const json& schema) {
  auto d = default_value(schema);
  return d.has_value() && d->is_object() ? *d : json::object();
}

}  // namespace dflash::config
