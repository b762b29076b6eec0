#include "plugin/plugin_kind.h"

namespace dflash::host {

const char* kind_section(dflash_kind kind) {
  switch (kind) {
    case DFLASH_KIND_DATA_SOURCE: return "data";
    case DFLASH_KIND_TARGET_MODEL: return "target";
    case DFLASH_KIND_DRAFTER: return "drafter";
    case DFLASH_KIND_LOSS: return "loss";
    case DFLASH_KIND_SCHEDULER: return "scheduler";
  }
  return "unknown";
}

const char* kind_display(dflash_kind kind) {
  switch (kind) {
    case DFLASH_KIND_DATA_SOURCE: return "data source";
    case DFLASH_KIND_TARGET_MODEL: return "target model";
    case DFLASH_KIND_DRAFTER: return "drafter";
    case DFLASH_KIND_LOSS: return "loss";
    case DFLASH_KIND_SCHEDULER: return "scheduler";
  }
  return "unknown";
}

std::optional<dflash_kind> kind_from_name(const std::string& name) {
  for (dflash_kind kind : kAllKinds)
    if (name == kind_section(kind) || name == kind_display(kind)) return kind;
  return std::nullopt;
}

bool is_known_kind(int32_t kind) {
  for (dflash_kind known : kAllKinds)
    if (kind == static_cast<int32_t>(known)) return true;
  return false;
}

}  // namespace dflash::host
