// The five plugin kinds and the names users see for them.
#pragma once

#include <dflash/abi.h>

#include <array>
#include <optional>
#include <string>

namespace dflash::host {

inline constexpr std::array<dflash_kind, 5> kAllKinds = {
    DFLASH_KIND_DATA_SOURCE, DFLASH_KIND_TARGET_MODEL, DFLASH_KIND_DRAFTER, DFLASH_KIND_LOSS, DFLASH_KIND_SCHEDULER};

// The config section and command-line flag of a kind: "data", "target",
// "drafter", "loss", "scheduler" (--data NAME, ..., {"loss": {"plugin": ...}}).
const char* kind_section(dflash_kind kind);
// A kind in words: "data source", "target model", ...
const char* kind_display(dflash_kind kind);
// Accepts the section name or the display name.
std::optional<dflash_kind> kind_from_name(const std::string& name);
bool is_known_kind(int32_t kind);

}  // namespace dflash::host
