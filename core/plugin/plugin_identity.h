// What identifies a plugin's build: its kind, name, version, ABI, library
// file and the XXH64 of the library's bytes. Recorded in a run's trainer
// state (resume compares it) and in `ab`'s results.json, so a report says
// exactly what was compared and a resumed run what it resumed.
#pragma once

#include "plugin/registry.h"

#include <nlohmann/json.hpp>

namespace dflash::host {

// {"kind", "name", "version", "abi", "file", "bytes", "xxh64"}; the file's
// bytes are read once per process and file.
nlohmann::json plugin_identity(const PluginRecord& record);

}  // namespace dflash::host
