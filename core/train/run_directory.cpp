#include "train/run_directory.h"

#include "checkpoint/checkpoint.h"
#include "log/log.h"

#include <nlohmann/json.hpp>

#include <climits>
#include <cstdlib>
#include <stdexcept>

namespace dflash::train {
namespace {

// The rule of the JSON writer the checkpoints use: a string it can write.
bool writable_as_json(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace

void validate_output_dir(const std::string& output_dir) {
  if (output_dir.empty())
    throw std::invalid_argument("train.output_dir is empty; set it to the folder for this run's checkpoints and "
                                "metrics.jsonl (e.g. runs/my-run)");
  if (!writable_as_json(output_dir))
    throw std::invalid_argument("train.output_dir " + nlohmann::json(output_dir).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                                " is not valid UTF-8; checkpoints record it in JSON, so choose a UTF-8 name");
  if (output_dir.find_first_not_of('/') == std::string::npos)
    throw std::invalid_argument("train.output_dir is the filesystem root \"" + output_dir +
                                "\"; set it to a folder of its own for this run (e.g. runs/my-run)");
}

std::unique_ptr<checkpoint::RunLock> claim_output_dir(const std::string& output_dir) {
  validate_output_dir(output_dir);
  checkpoint::make_directories(output_dir);
  // "/." or a symbolic link to / reach the root by another spelling.
  char resolved[PATH_MAX];
  if (::realpath(output_dir.c_str(), resolved) != nullptr && std::string(resolved) == "/")
    throw std::invalid_argument("train.output_dir \"" + output_dir +
                                "\" is the filesystem root; set it to a folder of its own for this run (e.g. runs/my-run)");
  auto lock = std::make_unique<checkpoint::RunLock>(output_dir);
  if (!lock->taken_over().empty())
    log::warn(lock->path() + ": taking over from a run that ended without releasing it (" + lock->taken_over() + ")");
  return lock;
}

}  // namespace dflash::train
