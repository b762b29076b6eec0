// Ranks that would train different things are refused before the first
// step: every rank describes its run (the resolved config, its plugins'
// names, versions and library hashes, the model files its plugins read) and
// each compares with rank 0's, naming the rank and what differs.
#pragma once

#include "dist/collective.h"

#include <nlohmann/json.hpp>

namespace dflash::dist {

// What a rank's run is made of. `config`: the resolved config as every rank
// resolved it (before any per-rank setting such as the device is applied);
// `plugins`: {section: plugin_identity}. The files: every "path" string of a
// plugin section that names a file or folder — each file's size, and the
// XXH64 of those under 64 MiB (configs, tokenizers, index files).
nlohmann::json run_fingerprint(const nlohmann::json& config, const nlohmann::json& plugins);

// Throws std::invalid_argument on every rank when some rank's fingerprint
// differs from rank 0's: "rank 2 differs from rank 0: config /train/lr: 0.001
// on rank 0, 0.002 on rank 2; ...".
void check_ranks_agree(Collective& group, const nlohmann::json& fingerprint);

}  // namespace dflash::dist
