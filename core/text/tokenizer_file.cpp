#include "text/tokenizer_file.h"

#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dflash::text {

namespace {
std::string format(const std::filesystem::path& file, const std::string& key, const std::string& message) {
  return "tokenizer file " + file.string() + ": " + (key.empty() ? "" : key + ": ") + message;
}
}  // namespace

TokenizerError::TokenizerError(std::filesystem::path file, std::string key, const std::string& message)
    : std::runtime_error(format(file, key, message)), file_(std::move(file)), key_(std::move(key)) {}

namespace detail {
namespace {

constexpr int kMaxNesting = 64;  // tokenizer.json nests 5 deep; this stops hostile files early

}  // namespace

void fail(const fs::path& file, const std::string& key, const std::string& message) {
  throw TokenizerError(file, key, message);
}

std::string read_file(const fs::path& file) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) fail(file, "", "no such file; give a tokenizer.json file or the model directory holding it");
    fail(file, "", std::string("cannot open it (") + std::strerror(error) + "); check the path and its permissions");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(file, "", std::string("cannot stat it (") + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) fail(file, "", "is a directory where a file was expected");
  if (!S_ISREG(st.st_mode))
    fail(file, "", "is not a regular file (a pipe, socket or device); give the tokenizer.json file itself");
  const auto size = static_cast<std::uintmax_t>(st.st_size);
  if (size > Tokenizer::kMaxFileBytes)
    fail(file, "", "is " + std::to_string(size >> 20) + " MiB; tokenizer files above " +
                       std::to_string(Tokenizer::kMaxFileBytes >> 20) +
                       " MiB are refused (real ones are 1-20 MB): is this the right file?");
  std::string text(static_cast<std::size_t>(size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(file, "", std::string("cannot read it (") + std::strerror(errno) + ")");
    if (n == 0) break;  // it shrank while we read: parse what there is, JSON will say if it is cut
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  return text;
}

json parse_json(const std::string& text, const fs::path& file, const std::vector<json_text::Stream>& streams) {
  try {
    return json_text::parse_strict(text, kMaxNesting, streams);
  } catch (const json_text::StrictJsonError& e) {
    switch (e.kind) {
      case json_text::StrictJsonError::Kind::kNulByte:
        fail(file, "", std::string(e.what()) + ": not a JSON text file (a binary or a damaged download?)");
      case json_text::StrictJsonError::Kind::kSyntax:
        fail(file, "", std::string(e.what()) + (e.at_end ? " (the file ends early: an interrupted download? fetch it again)" : ""));
      case json_text::StrictJsonError::Kind::kTooDeep:
        fail(file, "", "JSON nested more than " + std::to_string(kMaxNesting) +
                           " levels deep; a tokenizer.json nests about 5: this is not one");
      case json_text::StrictJsonError::Kind::kDuplicateKey:
        fail(file, e.path, "the key \"" + e.key + "\" appears twice in one object; each key must appear once (a vocabulary "
                           "lists each token once): the file is damaged or hand-edited");
    }
    throw;
  }
}

std::string describe(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_float: return "a number with a fraction";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    default: return "a " + std::string(value.type_name());
  }
}

std::string key_of(const std::string& parent, std::string_view name) {
  return parent.empty() ? std::string(name) : parent + "." + std::string(name);
}

std::string index_of(const std::string& parent, std::size_t i) { return parent + "[" + std::to_string(i) + "]"; }

Fields::Fields(const fs::path& file, const json& object, std::string parent)
    : file_(file), object_(object), parent_(std::move(parent)) {
  if (!object_.is_object())
    detail::fail(file_, parent_, "must be an object, not " + describe(object_) + "; see docs/tokenizer.md");
}

bool Fields::has(std::string_view name) const {
  const auto it = object_.find(std::string(name));
  return it != object_.end() && !it->is_null();
}

const json& Fields::required(std::string_view name) const {
  const auto it = object_.find(std::string(name));
  if (it == object_.end() || it->is_null())
    detail::fail(file_, key(name), "missing; a tokenizer.json of this kind has it (is the file complete?)");
  return *it;
}

const json& Fields::object(std::string_view name) const {
  const json& v = required(name);
  if (!v.is_object()) fail(name, "must be an object, not " + describe(v));
  return v;
}

const json& Fields::array(std::string_view name) const {
  const json& v = required(name);
  if (!v.is_array()) fail(name, "must be an array, not " + describe(v));
  return v;
}

std::string Fields::string(std::string_view name) const {
  const json& v = required(name);
  if (!v.is_string()) fail(name, "must be a string, not " + describe(v));
  return v.get<std::string>();
}

bool Fields::boolean(std::string_view name, bool fallback) const {
  if (!has(name)) return fallback;
  const json& v = object_.at(std::string(name));
  if (!v.is_boolean()) fail(name, "must be true or false, not " + describe(v));
  return v.get<bool>();
}

bool Fields::boolean(std::string_view name) const {
  required(name);
  return boolean(name, false);
}

void Fields::fail(std::string_view name, const std::string& message) const { detail::fail(file_, key(name), message); }

int32_t token_id(const json& value, const fs::path& file, const std::string& key) {
  if (!value.is_number_integer())
    fail(file, key, "must be a token id (an integer), not " + describe(value) + " (" + value.dump() + ")");
  if (value.is_number_unsigned() ? value.get<uint64_t>() > static_cast<uint64_t>(kMaxTokenId)
                                 : (value.get<int64_t>() < 0 || value.get<int64_t>() > kMaxTokenId))
    fail(file, key, "token id " + value.dump() + " is outside 0 .. " + std::to_string(kMaxTokenId) +
                        "; ids are non-negative and below 2^24");
  return static_cast<int32_t>(value.get<int64_t>());
}

}  // namespace detail
}  // namespace dflash::text
