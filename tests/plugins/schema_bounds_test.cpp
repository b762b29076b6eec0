// Every number and count a config can set is bounded on both sides, in the
// host's train section and in every in-tree plugin's schema: a value far
// outside any real run (train.collective_timeout_s = 1e300, train.lr = 1e300)
// is refused when the config is read, naming its key, instead of
// overflowing a conversion later (a timeout of −9.2e15 s, a step-0 error
// that names no setting).
#include "plugin/registry.h"
#include "train/train_schema.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {
using namespace dflash::host;

// The settings of type integer or number under `schema` lacking a lower or
// an upper bound, as "section.path".
void unbounded(const nlohmann::json& schema, const std::string& path, std::vector<std::string>& out) {
  if (!schema.contains("properties")) return;
  for (const auto& [name, property] : schema.at("properties").items()) {
    const std::string key = path + "." + name;
    const std::string type = property.value("type", "");
    if (type == "object") {
      unbounded(property, key, out);
      continue;
    }
    if (type != "integer" && type != "number") continue;
    const bool low = property.contains("minimum") || property.contains("exclusiveMinimum");
    const bool high = property.contains("maximum") || property.contains("exclusiveMaximum");
    if (!low || !high) out.push_back(key + (low ? " (no upper bound)" : " (no lower bound)"));
  }
}

TEST(SchemaBounds, EveryNumberAndCountIsBoundedOnBothSides) {
  std::vector<std::string> found;
  unbounded(dflash::train::train_schema(), "train", found);
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  const char* const section[] = {"", "data", "target", "drafter", "loss", "scheduler"};  // by dflash_kind
  const std::vector<std::pair<dflash_kind, std::string>> expected = {
      {DFLASH_KIND_DATA_SOURCE, "jsonl"},   {DFLASH_KIND_DATA_SOURCE, "synthetic"},
      {DFLASH_KIND_TARGET_MODEL, "hf_decoder"}, {DFLASH_KIND_TARGET_MODEL, "hf_hybrid"},
      {DFLASH_KIND_DRAFTER, "dflash"},      {DFLASH_KIND_DRAFTER, "prompt_lookup"},
      {DFLASH_KIND_LOSS, "ce"},             {DFLASH_KIND_LOSS, "fused_ckpt_kl"},
      {DFLASH_KIND_LOSS, "kl"},             {DFLASH_KIND_LOSS, "topk_kl"},
      {DFLASH_KIND_SCHEDULER, "constant"},  {DFLASH_KIND_SCHEDULER, "warmup_cosine"},
      {DFLASH_KIND_SCHEDULER, "wsd"}};
  for (const auto& [kind, name] : expected) {
    const PluginRecord& record = registry.find(kind, name);  // throws when the build lacks it
    unbounded(record.schema, std::string(section[static_cast<int>(kind)]) + "(" + name + ")", found);
  }
  std::string list;
  for (const std::string& key : found) list += "\n  " + key;
  EXPECT_TRUE(found.empty()) << found.size() << " settings without both bounds:" << list;
}

}  // namespace
