#include "plugin/drafter_facts.h"

#include "plugin/instances.h"

#include <stdexcept>

namespace dflash::host {
namespace {

std::invalid_argument refused(const std::string& label, const std::string& what) {
  return std::invalid_argument(label + ": its export_config " + what +
                               "; the host needs block_size and target_layer_ids from every drafter and guesses "
                               "neither (docs/writing-plugins.md, drafter)");
}

int64_t whole_number(const nlohmann::json& value, const std::string& key, int64_t least, const std::string& label) {
  if (!value.is_number_integer() || value.get<int64_t>() < least)
    throw refused(label, "gives " + key + " = " + value.dump() + ", not an integer ≥ " + std::to_string(least));
  return value.get<int64_t>();
}

}  // namespace

DrafterFacts parse_drafter_facts(const std::optional<nlohmann::json>& exported, const std::string& label) {
  if (!exported) throw refused(label, "is missing (the optional slot is empty)");
  if (!exported->is_object()) throw refused(label, "is " + exported->dump() + ", not an object");
  for (const char* key : {"block_size", "target_layer_ids"})
    if (!exported->contains(key)) throw refused(label, std::string("has no ") + key);
  DrafterFacts facts;
  facts.block_size = whole_number(exported->at("block_size"), "block_size", 1, label);
  const nlohmann::json& ids = exported->at("target_layer_ids");
  if (!ids.is_array()) throw refused(label, "gives target_layer_ids = " + ids.dump() + ", not a list");
  for (const nlohmann::json& id : ids) facts.target_layer_ids.push_back(whole_number(id, "target_layer_ids[]", 0, label));
  return facts;
}

DrafterFacts drafter_facts(const DrafterInstance& drafter) {
  return parse_drafter_facts(drafter.export_config(), drafter.record().label());
}

}  // namespace dflash::host
