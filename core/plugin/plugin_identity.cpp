#include "plugin/plugin_identity.h"

#include "hash/file_hash.h"
#include "plugin/plugin_kind.h"

#include <map>
#include <mutex>

namespace dflash::host {

nlohmann::json plugin_identity(const PluginRecord& record) {
  static std::mutex mutex;
  static std::map<std::string, hash::FileDigest> digests;
  const std::string file = record.file.string();
  hash::FileDigest digest;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = digests.find(file);
    if (it == digests.end()) it = digests.emplace(file, hash::digest_file(file)).first;
    digest = it->second;
  }
  return {{"kind", kind_section(record.kind)},
          {"name", record.name},
          {"version", record.version},
          {"abi", std::to_string(record.abi_major) + "." + std::to_string(record.abi_minor)},
          {"file", file},
          {"bytes", digest.bytes},
          {"xxh64", digest.xxh64}};
}

}  // namespace dflash::host
