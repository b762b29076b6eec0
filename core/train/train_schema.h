// The host's own config section, "train": what the training loop reads.
// Written once here; `dflash-host describe host` prints it.
#pragma once

#include <nlohmann/json.hpp>

namespace dflash::train {

const nlohmann::json& train_schema();

}  // namespace dflash::train
