#include "metrics/tensorboard.h"

#include "metrics/progress.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>

namespace dflash::metrics {
namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

// --- the protobuf wire format, the three field kinds the messages use ---
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire_type) { varint(out, (static_cast<uint64_t>(field) << 3) | wire_type); }
template <class T>
void little_endian(std::string& out, T value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64 are little-endian, as the format is
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}
void length_delimited(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);  // wall_time: double
  little_endian(e, wall_time);
  if (step != 0) {
    key(e, 2, 0);  // step: int64 (two's complement varint)
    varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw MetricsWriteError(path + ": cannot write the TensorBoard event file (" + errno_text() + ")");
    done += static_cast<size_t>(n);
  }
}

// `path` made to hold `bytes` through a temporary file and a rename: a
// crash midway leaves the old file (or none), never a part of the new one.
void replace_file(const std::string& path, const std::string& bytes) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(temporary + ": cannot write the TensorBoard event file (" + errno_text() + ")");
  try {
    write_all(fd, bytes, temporary);
  } catch (...) {
    ::close(fd);
    std::remove(temporary.c_str());
    throw;
  }
  // The descriptor is closed and a half-made temporary removed whichever step fails.
  const bool synced = ::fsync(fd) == 0;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    std::remove(temporary.c_str());
    throw std::runtime_error(path + ": cannot replace the TensorBoard event file (" + reason + ")");
  }
}

// Reads the fields of an Event payload this writer and TensorBoard's make:
// its step and whether it is the file-version event.
struct EventFields {
  int64_t step = 0;
  bool file_version = false;
  bool valid = true;
};
EventFields fields_of(const std::string& p) {
  EventFields f;
  size_t at = 0;
  auto read_varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && at < p.size(); shift += 7) {
      const auto byte = static_cast<unsigned char>(p[at++]);
      v |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  };
  while (at < p.size()) {
    uint64_t tag = 0, value = 0;
    if (!read_varint(tag)) return f.valid = false, f;
    const int field = static_cast<int>(tag >> 3), wire = static_cast<int>(tag & 7);
    if (wire == 0) {
      if (!read_varint(value)) return f.valid = false, f;
      if (field == 2) f.step = static_cast<int64_t>(value);
    } else if (wire == 1) {
      at += 8;
    } else if (wire == 5) {
      at += 4;
    } else if (wire == 2) {
      if (!read_varint(value) || value > p.size() - at) return f.valid = false, f;
      if (field == 3) f.file_version = true;
      at += static_cast<size_t>(value);
    } else {
      return f.valid = false, f;
    }
  }
  f.valid = at == p.size();
  return f;
}

void flatten(const nlohmann::json& value, const std::string& tag, std::vector<std::pair<std::string, float>>& out) {
  if (value.is_number()) {
    out.emplace_back(tag, static_cast<float>(value.get<double>()));  // NaN and ±inf too: TensorBoard shows them
  } else if (value.is_boolean()) {
    out.emplace_back(tag, value.get<bool>() ? 1.0f : 0.0f);
  } else if (value.is_object()) {
    for (const auto& [name, item] : value.items()) flatten(item, tag.empty() ? name : tag + "/" + name, out);
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) flatten(value[i], tag + "/" + std::to_string(i), out);
  }
}

// The folder's event file: an existing events.out.tfevents.* (the first by
// name), else a new one named as TensorBoard's writers name theirs.
std::string event_file_in(const std::string& directory) {
  namespace fs = std::filesystem;
  std::string found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0 && name.find(".tmp") == std::string::npos && (found.empty() || name < found))
      found = entry.path().string();
  }
  if (!found.empty()) return found;
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  return (fs::path(directory) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." + host))
      .string();
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ bytes[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& payload) {
  std::string out;
  const uint64_t length = payload.size();
  little_endian(out, length);
  little_endian(out, masked_crc32c(out.data(), 8));
  out += payload;
  little_endian(out, masked_crc32c(payload.data(), payload.size()));
  return out;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  length_delimited(e, 3, "brain.Event:2");
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    length_delimited(v, 1, tag);
    key(v, 2, 5);  // simple_value: float
    little_endian(v, value);
    length_delimited(summary, 1, v);
  }
  std::string e = event_head(wall_time, step);
  length_delimited(e, 5, summary);
  return e;
}

std::vector<std::pair<std::string, float>> scalars_of(const nlohmann::json& record, const std::string& prefix) {
  std::vector<std::pair<std::string, float>> out;
  if (!record.is_object()) return out;
  for (const auto& [name, value] : record.items())
    if (name != "step") flatten(value, prefix.empty() ? name : prefix + "/" + name, out);
  return out;
}

int64_t event_step(const std::string& payload) { return fields_of(payload).step; }

EventRecords read_event_records(const std::string& path) {
  EventRecords r;
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) break;
    uint64_t length = 0;
    uint32_t length_crc = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    if (length_crc != masked_crc32c(bytes.data() + at, 8) || length > bytes.size() - at - 16) break;
    const std::string payload = bytes.substr(at + 12, static_cast<size_t>(length));
    uint32_t payload_crc = 0;
    std::memcpy(&payload_crc, bytes.data() + at + 12 + length, 4);
    if (payload_crc != masked_crc32c(payload.data(), payload.size())) break;
    r.payloads.push_back(payload);
    at += 16 + static_cast<size_t>(length);
  }
  r.valid_bytes = at;
  r.clean = at == bytes.size();
  return r;
}

EventFile::EventFile(const std::string& directory, int64_t first_step) : path_(event_file_in(directory)) {
  struct stat st {};
  const bool exists = ::stat(path_.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode))
    throw std::runtime_error(path_ + ": exists and is not a regular file; move it away so the run can write its TensorBoard events");
  std::string kept;
  bool rewrite = !exists;
  if (exists) {
    const EventRecords records = read_event_records(path_);
    bool has_version = false;
    for (const std::string& p : records.payloads) {
      const EventFields f = fields_of(p);
      if (f.file_version) {
        if (!has_version) kept += tfrecord(p);
        has_version = true;
      } else if (f.valid && f.step < first_step) {
        kept += tfrecord(p);
      } else {
        rewrite = true;  // a step the resumed run writes again
      }
    }
    if (!has_version) kept = tfrecord(file_version_event(now_seconds())) + kept, rewrite = true;
    if (!records.clean) rewrite = true;  // a torn last record
  } else {
    kept = tfrecord(file_version_event(now_seconds()));
  }
  if (rewrite) replace_file(path_, kept);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(path_ + ": cannot write the TensorBoard event file (" + errno_text() + ")");
}

void write_event_file(const std::string& path, int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  const double now = now_seconds();
  const std::string bytes = tfrecord(file_version_event(now)) + tfrecord(scalars_event(now, step, scalars));
  replace_file(path, bytes);
}

EventFile::~EventFile() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFile::write(const nlohmann::json& record) {
  const int64_t step = record.value("step", int64_t{0});
  const std::string bytes = tfrecord(scalars_event(now_seconds(), step, scalars_of(record)));
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  try {
    write_all(fd_, bytes, path_);
  } catch (...) {
    // Leave no torn record behind: the file ends at the last whole one.
    if (before >= 0 && ::ftruncate(fd_, before) != 0) { /* the reader stops at a torn last record all the same */ }
    throw;
  }
}

}  // namespace dflash::metrics
