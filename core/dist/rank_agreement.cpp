#include "dist/rank_agreement.h"

#include "hash/file_hash.h"

#include <filesystem>
#include <stdexcept>

namespace dflash::dist {
namespace {

namespace fs = std::filesystem;

constexpr uintmax_t kHashedBelow = uintmax_t{64} << 20;

nlohmann::json file_facts(const fs::path& file) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(file, ec);
  if (ec) return {{"error", ec.message()}};
  nlohmann::json facts = {{"bytes", size}};
  if (size < kHashedBelow) {
    try {
      facts["xxh64"] = hash::digest_file(file.string()).xxh64;
    } catch (const std::exception& e) {
      facts["error"] = e.what();
    }
  }
  return facts;
}

nlohmann::json path_facts(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_regular_file(p, ec)) return file_facts(p);
  if (!fs::is_directory(p, ec)) return {{"exists", false}};
  nlohmann::json files = nlohmann::json::object();
  for (const auto& entry : fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec))
    if (entry.is_regular_file(ec)) files[fs::relative(entry.path(), p, ec).generic_string()] = file_facts(entry.path());
  return files;
}

std::string shown(const nlohmann::json& value) {
  std::string text = value.dump();
  return text.size() > 120 ? text.substr(0, 117) + "..." : text;
}

}  // namespace

nlohmann::json run_fingerprint(const nlohmann::json& config, const nlohmann::json& plugins) {
  nlohmann::json libraries = nlohmann::json::object();
  for (const auto& [section, identity] : plugins.items()) {
    nlohmann::json same = identity;
    same.erase("file");  // the library's place may differ between nodes; its bytes may not
    libraries[section] = same;
  }
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [section, settings] : config.items()) {
    if (section == "train" || !settings.is_object()) continue;
    for (const auto& [key, value] : settings.items())
      if (value.is_string() && key.find("path") != std::string::npos && !value.get<std::string>().empty())
        files[section + "." + key] = path_facts(value.get<std::string>());
  }
  return {{"config", config}, {"plugins", libraries}, {"files", files}};
}

void check_ranks_agree(Collective& group, const nlohmann::json& fingerprint) {
  if (group.world_size() == 1) return;
  const std::vector<std::string> texts = group.all_gather_text(fingerprint.dump(), "the ranks' run descriptions");
  const nlohmann::json reference = nlohmann::json::parse(texts.at(0));
  std::string problems;
  for (size_t r = 1; r < texts.size(); ++r) {
    const nlohmann::json theirs = nlohmann::json::parse(texts[r]);
    const nlohmann::json diff = nlohmann::json::diff(reference, theirs);
    if (diff.empty()) continue;
    problems += "\n  rank " + std::to_string(r) + " differs from rank 0:";
    size_t listed = 0;
    for (const auto& op : diff) {
      if (++listed > 8) {
        problems += " …";
        break;
      }
      const std::string path = op.at("path");
      const nlohmann::json::json_pointer pointer(path);
      const std::string on0 = reference.contains(pointer) ? shown(reference.at(pointer)) : "(absent)";
      const std::string onr = theirs.contains(pointer) ? shown(theirs.at(pointer)) : "(absent)";
      problems += "\n    " + path + ": " + on0 + " on rank 0, " + onr + " on rank " + std::to_string(r);
    }
  }
  if (!problems.empty())
    throw std::invalid_argument("the ranks would not train the same run (config, plugins and their versions, model "
                                "files):" + problems +
                                "\nstart every rank with the same config, plugins and model files");
}

}  // namespace dflash::dist
