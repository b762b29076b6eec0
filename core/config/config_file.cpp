#include "config/config_file.h"

#include "json/strict_json.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dflash::config {

using nlohmann::json;

namespace {

using detail::kind_of;
using detail::preview;

std::string json_quote(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

const char* const kCheckPath = "check the path given to --config";

// True when `event` opens an object or array `depth` containers deep (nlohmann's
// depth: 0 for the top level) that would nest deeper than `levels`.
bool opens_too_deep(int depth, json::parse_event_t event, std::size_t levels) {
  const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
  return opens && static_cast<std::size_t>(depth) + 1 > levels;
}

// What a file that is not a regular file is, for the message; nullptr for a
// regular file.
const char* non_regular_kind(mode_t mode) {
  if (S_ISREG(mode)) return nullptr;
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

[[noreturn]] void refuse_kind(const std::string& name, const char* kind) {
  throw ConfigError("", "config file \"" + name + "\" is " + kind + ", not a regular file; " + kCheckPath);
}

[[noreturn]] void refuse_size(const std::string& name, const std::string& size) {
  throw ConfigError("", "config file \"" + name + "\" is " + size + ", more than the " +
                            std::to_string(kMaxConfigBytes >> 20) + " MiB a configuration may be; " + kCheckPath);
}

[[noreturn]] void refuse_errno(const std::string& name, const char* verb, int err) {
  throw ConfigError("", std::string("cannot ") + verb + " config file \"" + name + "\": " + std::strerror(err) + "; " +
                            kCheckPath);
}

// The file's bytes. Only a regular file is read: it is looked at with stat
// before it is opened (opening a FIFO for reading blocks until a writer
// comes), opened non-blocking and checked again on the descriptor (the path
// may have changed in between), and read up to kMaxConfigBytes (a file that
// grows while it is read, or /proc-style files that report size 0, stop there).
std::string read_config_text(const std::string& name) {
  struct stat info {};
  if (::stat(name.c_str(), &info) != 0) {
    const int err = errno;
    if (err == ENOENT) throw ConfigError("", "config file \"" + name + "\" does not exist; " + kCheckPath);
    refuse_errno(name, "access", err);
  }
  if (const char* kind = non_regular_kind(info.st_mode)) refuse_kind(name, kind);
  if (static_cast<std::uintmax_t>(info.st_size) > kMaxConfigBytes) {
    refuse_size(name, std::to_string(static_cast<std::uintmax_t>(info.st_size)) + " bytes");
  }

  const int fd = ::open(name.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) refuse_errno(name, "read", errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &info) != 0) refuse_errno(name, "read", errno);
  if (const char* kind = non_regular_kind(info.st_mode)) refuse_kind(name, kind);

  std::string text;
  char buffer[65536];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refuse_errno(name, "read", errno);
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > kMaxConfigBytes) refuse_size(name, "more than " + std::to_string(kMaxConfigBytes) + " bytes");
  }
  return text;
}

// ---------------------------------------------------------------------------
// --set
// ---------------------------------------------------------------------------

struct Step {
  bool is_index = false;
  std::string name;       // object member
  std::size_t index = 0;  // array element
};

std::string a_kind(const json& value) {
  const std::string kind = kind_of(value);
  if (value.is_null()) return "null";
  const bool vowel = kind == "integer" || kind == "array" || kind == "object";
  return (vowel ? "an " : "a ") + kind + " (" + preview(value, 40) + ")";
}

std::vector<Step> parse_key(const std::string& key, const std::string& shown) {
  auto malformed = [&](const std::string& problem) {
    return ConfigError("", shown + ": " + problem + " in key " + json_quote(key) +
                               "; expected --set name.name[index]...=value");
  };
  std::vector<Step> steps;
  std::size_t i = 0;
  while (true) {
    const std::size_t end = key.find_first_of(".[]", i);
    const std::string name = key.substr(i, end == std::string::npos ? std::string::npos : end - i);
    if (name.empty()) throw malformed("empty path segment");
    Step step;
    step.name = name;
    steps.push_back(step);
    i = end;
    if (i == std::string::npos) break;
    if (key[i] == ']') throw malformed("unmatched ']'");
    while (i < key.size() && key[i] == '[') {
      const std::size_t close = key.find(']', i);
      if (close == std::string::npos) throw malformed("unclosed '['");
      const std::string digits = key.substr(i + 1, close - i - 1);
      if (digits.empty() || digits.size() > 9 ||
          digits.find_first_not_of("0123456789") != std::string::npos) {
        throw malformed("bad array index [" + digits + "] (expected a non-negative integer)");
      }
      Step index_step;
      index_step.is_index = true;
      index_step.index = static_cast<std::size_t>(std::stoul(digits));
      steps.push_back(index_step);
      i = close + 1;
    }
    if (i >= key.size()) break;
    if (key[i] != '.') throw malformed(std::string("unexpected '") + key[i] + "' after ']'");
    ++i;
    if (i >= key.size()) throw malformed("empty path segment");
  }
  return steps;
}

// The value of a --set: JSON when it parses, the plain string otherwise. The
// key path's `key_levels` objects and arrays and the value's own together may
// nest kMaxNesting deep; the parser stops a deeper value as it reads it.
json override_value(const std::string& text, std::size_t key_levels, const std::string& shown) {
  const std::string limit = "the most a configuration may nest is " + std::to_string(kMaxNesting) + " levels";
  if (key_levels > kMaxNesting) {
    throw ConfigError("", shown + ": the key has " + std::to_string(key_levels) + " levels; " + limit);
  }
  struct TooDeep {};
  const std::size_t room = kMaxNesting - key_levels;
  auto check = [room](int depth, json::parse_event_t event, json& /*parsed*/) {
    if (opens_too_deep(depth, event, room)) throw TooDeep{};
    return true;
  };
  json value;
  try {
    value = json::parse(text, check, /*allow_exceptions=*/false, /*ignore_comments=*/false);
  } catch (const TooDeep&) {
    throw ConfigError("", shown + ": the value nests more than " + std::to_string(room) +
                              " objects and arrays deep under a key of " + std::to_string(key_levels) +
                              (key_levels == 1 ? " level; " : " levels; ") + limit);
  }
  if (value.is_discarded()) value = text;
  return value;
}

}  // namespace

json load_json_file(const std::filesystem::path& file) {
  const std::string name = file.string();
  const std::string text = read_config_text(name);
  json root;
  try {
    root = json_text::parse_strict(text, kMaxNesting);
  } catch (const json_text::StrictJsonError& e) {
    const std::string head = "config file \"" + name + "\": ";
    switch (e.kind) {
      case json_text::StrictJsonError::Kind::kNulByte:
        throw ConfigError("", head + e.what() + "; a JSON file is text, check the path given to --config");
      case json_text::StrictJsonError::Kind::kSyntax:
        throw ConfigError("", head + e.what() + (e.at_slash ? " (comments are not allowed in JSON)" : ""));
      case json_text::StrictJsonError::Kind::kTooDeep:
        throw ConfigError(e.path, head + "the value at " + json_quote(e.path) + " nests more than " +
                                      std::to_string(kMaxNesting) +
                                      " objects and arrays deep, the most a configuration may; check the file");
      case json_text::StrictJsonError::Kind::kDuplicateKey:
        throw ConfigError(e.path, head + "duplicate key " + json_quote(e.path) + "; a key may appear only once in an object");
    }
  }
  if (!root.is_object()) {
    throw ConfigError("", "config file \"" + name + "\": the top level must be a JSON object ({...}), got " +
                              kind_of(root));
  }
  return root;
}

void apply_override(json& root, const std::string& assignment) {
  const std::string shown = "--set '" + (assignment.size() > 120 ? assignment.substr(0, 117) + "..." : assignment) + "'";
  const std::size_t eq = assignment.find('=');
  if (eq == std::string::npos) {
    throw ConfigError("", shown + ": missing '='; expected --set key.path=value");
  }
  const std::string key = assignment.substr(0, eq);
  if (key.empty()) throw ConfigError("", shown + ": empty key before '='; expected --set key.path=value");
  const std::vector<Step> steps = parse_key(key, shown);
  const json value = override_value(assignment.substr(eq + 1), steps.size(), shown);

  if (!root.is_null() && !root.is_object()) {
    throw ConfigError("", shown + ": the configuration is " + a_kind(root) + ", not an object");
  }
  json result = root.is_null() ? json::object() : root;  // root stays unchanged on error
  json* current = &result;
  std::string walked;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const Step& step = steps[s];
    const bool last = s + 1 == steps.size();
    if (!step.is_index) {
      if (current->is_null()) *current = json::object();
      if (!current->is_object()) {
        throw ConfigError(walked, shown + ": cannot set " + json_quote(key) + " because " + json_quote(walked) + " is " +
                                      a_kind(*current) + ", not an object");
      }
      const std::string parent = walked;
      walked += (walked.empty() ? "" : ".") + step.name;
      if (last) {
        (*current)[step.name] = value;
        break;
      }
      if (!current->contains(step.name)) {
        if (steps[s + 1].is_index) {
          throw ConfigError(walked, shown + ": " + json_quote(walked) + " does not exist, so element [" +
                                        std::to_string(steps[s + 1].index) +
                                        "] cannot be set; set the whole array instead");
        }
        (*current)[step.name] = json::object();
      }
      current = &(*current)[step.name];
    } else {
      const std::string element = walked + "[" + std::to_string(step.index) + "]";
      if (!current->is_array()) {
        throw ConfigError(walked, shown + ": cannot set " + json_quote(key) + " because " + json_quote(walked) + " is " +
                                      a_kind(*current) + ", not an array");
      }
      if (step.index >= current->size()) {
        throw ConfigError(element, shown + ": " + json_quote(walked) + " has " + std::to_string(current->size()) +
                                       (current->size() == 1 ? " element" : " elements") + ", so " +
                                       json_quote(element) + " does not exist; set the whole array instead");
      }
      walked = element;
      if (last) {
        (*current)[step.index] = value;
        break;
      }
      current = &(*current)[step.index];
    }
  }
  root = std::move(result);
}

}  // namespace dflash::config
