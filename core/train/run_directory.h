// train.output_dir, checked before anything is written into it: not empty,
// not the filesystem root, a name that can be written into JSON, and held by
// this run alone (checkpoint/run_lock.h).
#pragma once

#include "checkpoint/run_lock.h"

#include <memory>
#include <string>

namespace dflash::train {

// Throws std::invalid_argument naming train.output_dir and the fix.
void validate_output_dir(const std::string& output_dir);

// Validates, creates (mkdir -p) and locks the output directory. The lock is
// released when the returned object is destroyed.
std::unique_ptr<checkpoint::RunLock> claim_output_dir(const std::string& output_dir);

}  // namespace dflash::train
