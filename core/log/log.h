// Logging for the host and, through dflash_host_api.log, for plugins.
// Everything goes to stderr through spdlog, so stdout stays for results.
#pragma once

#include <cstdint>
#include <string>

namespace dflash::log {

// "trace", "debug", "info", "warn", "error", "off"; throws std::invalid_argument otherwise.
void set_level(const std::string& level);

// One rank of several: every line says which, "[rank 1/4]".
void set_rank(int rank, int world_size);
// "dflash-host: ", or "dflash-host [rank 1/4]: " after set_rank: what the
// process's last error line starts with.
const std::string& program_prefix();

void plugin_message(int32_t level, const std::string& plugin_name, const std::string& message);

void info(const std::string& message);
void warn(const std::string& message);
void error(const std::string& message);
void debug(const std::string& message);

}  // namespace dflash::log
