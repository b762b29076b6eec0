#include "log/log.h"

#include <dflash/abi.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <stdexcept>

namespace dflash::log {
namespace {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto made = spdlog::stderr_color_mt("dflash");
    made->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    made->set_level(spdlog::level::info);
    return made;
  }();
  return *instance;
}

std::string& program_prefix_storage() {
  static std::string prefix = "dflash-host: ";
  return prefix;
}

spdlog::level::level_enum from_abi(int32_t level) {
  switch (level) {
    case DFLASH_LOG_TRACE: return spdlog::level::trace;
    case DFLASH_LOG_DEBUG: return spdlog::level::debug;
    case DFLASH_LOG_INFO: return spdlog::level::info;
    case DFLASH_LOG_WARN: return spdlog::level::warn;
    default: return spdlog::level::err;
  }
}

}  // namespace

void set_level(const std::string& level) {
  static const std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  for (const auto& [name, value] : kLevels) {
    if (level == name) {
      logger().set_level(value);
      return;
    }
  }
  throw std::invalid_argument("--log-level " + level + ": expected trace, debug, info, warn, error or off");
}

void set_rank(int rank, int world_size) {
  logger().set_pattern("[%H:%M:%S.%e] [rank " + std::to_string(rank) + "/" + std::to_string(world_size) + "] [%^%l%$] %v");
  program_prefix_storage() = "dflash-host [rank " + std::to_string(rank) + "/" + std::to_string(world_size) + "]: ";
}

const std::string& program_prefix() { return program_prefix_storage(); }

void plugin_message(int32_t level, const std::string& plugin_name, const std::string& message) {
  logger().log(from_abi(level), "[{}] {}", plugin_name, message);
}

void info(const std::string& message) { logger().info("{}", message); }
void warn(const std::string& message) { logger().warn("{}", message); }
void error(const std::string& message) { logger().error("{}", message); }
void debug(const std::string& message) { logger().debug("{}", message); }

}  // namespace dflash::log
