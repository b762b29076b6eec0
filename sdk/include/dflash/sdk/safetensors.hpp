// dflash/sdk/safetensors.hpp — read and write the safetensors format
// (Hugging Face checkpoints) without LibTorch: an 8-byte little-endian header
// length, a JSON header, then the tensors' bytes.
//
// Reading memory-maps the file (copy-on-write, so callers may alias it
// without risk to the file) and checks every offset and size before any byte
// is touched. Every problem is a FormatError whose one-line message names the
// file, the tensor when there is one, and what is wrong. Writing is atomic: a
// temporary file in the same folder, flushed, then renamed over the target,
// so a crash never leaves a half-written checkpoint under the real name.
// (LibTorch adaptors: dflash/sdk/safetensors_torch.hpp.)
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dflash::sdk::safetensors {

class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3, kF8E5M2 };

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t bytes;
};
inline const std::vector<DTypeInfo>& dtype_table() {
  static const std::vector<DTypeInfo> table = {
      {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},       {DType::kBF16, "BF16", 2},
      {DType::kI64, "I64", 8},   {DType::kI32, "I32", 4}, {DType::kI16, "I16", 2},       {DType::kI8, "I8", 1},
      {DType::kU8, "U8", 1},     {DType::kBool, "BOOL", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1}};
  return table;
}
inline size_t dtype_bytes(DType d) {
  for (const auto& e : dtype_table())
    if (e.dtype == d) return e.bytes;
  return 0;
}
inline const char* dtype_name(DType d) {
  for (const auto& e : dtype_table())
    if (e.dtype == d) return e.name;
  return "?";
}
inline std::optional<DType> parse_dtype(const std::string& name) {
  for (const auto& e : dtype_table())
    if (name == e.name) return e.dtype;
  return std::nullopt;
}

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

struct Header {
  std::vector<TensorInfo> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data section
  uint64_t data_size = 0;
};

// Largest header accepted: far above any real checkpoint's, low enough that a
// corrupt length cannot make us allocate gigabytes.
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Parses and checks the header of a safetensors image of `size` bytes.
// `what` names the file in messages.
inline Header parse_header(const uint8_t* bytes, size_t size, const std::string& what) {
  auto fail = [&](const std::string& message) -> FormatError { return FormatError(what + ": " + message); };
  if (size < 8) throw fail("only " + std::to_string(size) + " bytes; a safetensors file starts with an 8-byte header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];
  if (header_bytes > kMaxHeaderBytes)
    throw fail("header length " + std::to_string(header_bytes) + " exceeds the " + std::to_string(kMaxHeaderBytes) +
               "-byte limit; the file is corrupt or not safetensors");
  if (header_bytes > size - 8)
    throw fail("header length " + std::to_string(header_bytes) + " is larger than the file after it (" +
               std::to_string(size - 8) + " bytes); the file is truncated or not safetensors");
  nlohmann::json json;
  // A key given twice (a tensor, or a field of one) is refused: the JSON
  // parser would keep the last silently, and two readers of the same file
  // could then disagree on what it holds.
  std::vector<std::set<std::string>> keys_seen;
  std::string duplicate;
  const auto no_duplicates = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) keys_seen.emplace_back();
    else if (event == Event::object_end && !keys_seen.empty()) keys_seen.pop_back();
    else if (event == Event::key && !keys_seen.empty() && !keys_seen.back().insert(parsed.get<std::string>()).second &&
             duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    json = nlohmann::json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(bytes + 8 + header_bytes),
                                 no_duplicates);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!duplicate.empty())
    throw fail("header gives the key '" + duplicate + "' twice; the file is corrupt or was altered");
  if (!json.is_object()) throw fail("header is not a JSON object");
  Header header;
  header.data_start = 8 + header_bytes;
  header.data_size = size - header.data_start;
  for (auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw fail("__metadata__ is not an object");
      for (auto& [key, value] : entry.items()) {
        if (!value.is_string()) throw fail("__metadata__." + key + " is not a string");
        header.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string who = "tensor '" + name + "'";
    if (!entry.is_object()) throw fail(who + " is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) throw fail(who + " has no dtype");
    const auto dtype = parse_dtype(entry["dtype"].get<std::string>());
    if (!dtype) throw fail(who + " has unknown dtype '" + entry["dtype"].get<std::string>() + "'");
    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    if (!entry.contains("shape") || !entry["shape"].is_array()) throw fail(who + " has no shape");
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        throw fail(who + " has a shape entry that is not a non-negative integer: " + d.dump());
      const uint64_t extent = d.get<uint64_t>();
      if (extent > 0 && numel > UINT64_MAX / extent) throw fail(who + " has a shape whose size overflows");
      numel *= extent;
      info.shape.push_back(static_cast<int64_t>(extent));
    }
    const auto& offsets = entry.contains("data_offsets") ? entry["data_offsets"] : nlohmann::json();
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      throw fail(who + " needs data_offsets [begin, end] of non-negative integers");
    info.begin = offsets[0].get<uint64_t>();
    info.end = offsets[1].get<uint64_t>();
    if (info.begin > info.end) throw fail(who + " has data_offsets with begin > end");
    if (info.end > header.data_size)
      throw fail(who + " ends at byte " + std::to_string(info.end) + " of the data, but the file holds only " +
                 std::to_string(header.data_size) + " data bytes; the file is truncated");
    const size_t element = dtype_bytes(info.dtype);
    if (numel > UINT64_MAX / element || numel * element != info.end - info.begin)
      throw fail(who + " spans " + std::to_string(info.end - info.begin) + " bytes, but its shape and dtype need " +
                 std::to_string(numel * element));
    header.tensors.push_back(std::move(info));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t covered = 0;
  for (const TensorInfo& t : header.tensors) {
    if (t.begin < covered)
      throw fail("tensor '" + t.name + "' overlaps the tensor before it (starts at " + std::to_string(t.begin) +
                 ", previous ends at " + std::to_string(covered) + ")");
    if (t.begin > covered)
      throw fail("bytes " + std::to_string(covered) + ".." + std::to_string(t.begin) +
                 " of the data belong to no tensor (a hole before '" + t.name + "')");
    covered = t.end;
  }
  if (covered != header.data_size)
    throw fail(std::to_string(header.data_size - covered) + " bytes after the last tensor belong to no tensor");
  return header;
}

// A read-only view of a safetensors file, memory-mapped for its lifetime.
class File {
 public:
  static std::shared_ptr<File> open(const std::filesystem::path& path) {
    return std::shared_ptr<File>(new File(path));
  }
  ~File() {
    if (map_ != nullptr && map_ != MAP_FAILED) munmap(map_, size_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const Header& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  const TensorInfo* find(const std::string& name) const {
    for (const TensorInfo& t : header_.tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  // Throws naming the file and the tensor.
  const TensorInfo& at(const std::string& name) const {
    if (const TensorInfo* t = find(name)) return *t;
    throw FormatError(path_.string() + ": no tensor named '" + name + "' (the file has " +
                      std::to_string(header_.tensors.size()) + " tensors)");
  }
  // Pointer to a tensor's bytes; valid while the File lives. Copy-on-write:
  // writing through it changes memory, never the file.
  uint8_t* data(const TensorInfo& t) const { return static_cast<uint8_t*>(map_) + header_.data_start + t.begin; }

 private:
  explicit File(const std::filesystem::path& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw FormatError(path.string() + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw FormatError(path.string() + ": not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      map_ = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (map_ == MAP_FAILED) {
        ::close(fd);
        throw FormatError(path.string() + ": cannot map (" + std::strerror(errno) + ")");
      }
    }
    ::close(fd);
    header_ = parse_header(static_cast<const uint8_t*>(map_), size_, path.string());
  }
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  Header header_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // borrowed for the call; numel × dtype bytes
};

// Writes atomically: <path>.tmp-<pid> in the same folder, fsync, rename.
inline void write_file(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) json["__metadata__"] = metadata;
  // Data in order of falling element size: with the data section 8-byte
  // aligned, every tensor then starts aligned for its dtype (readers can
  // alias the bytes without a copy).
  std::vector<const TensorToWrite*> ordered;
  for (const TensorToWrite& t : tensors) ordered.push_back(&t);
  std::stable_sort(ordered.begin(), ordered.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    return dtype_bytes(a->dtype) > dtype_bytes(b->dtype);
  });
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const TensorToWrite* entry : ordered) {
    const TensorToWrite& t = *entry;
    if (t.name.empty() || t.name == "__metadata__") throw FormatError(path.string() + ": invalid tensor name '" + t.name + "'");
    if (json.contains(t.name)) throw FormatError(path.string() + ": tensor '" + t.name + "' is written twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw FormatError(path.string() + ": tensor '" + t.name + "' has a negative extent");
      numel *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = numel * dtype_bytes(t.dtype);
    json[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string header = json.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const std::filesystem::path temp = path.string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw FormatError(temp.string() + ": cannot create (" + std::strerror(errno) + ")");
  auto write_all = [&](const void* data, uint64_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd, p, static_cast<size_t>(std::min<uint64_t>(bytes, 1u << 30)));
      if (n < 0) {
        if (errno == EINTR) continue;
        const std::string reason = std::strerror(errno);
        ::close(fd);
        ::unlink(temp.c_str());
        throw FormatError(temp.string() + ": write failed (" + reason + ")");
      }
      p += n;
      bytes -= static_cast<uint64_t>(n);
    }
  };
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
  write_all(length, 8);
  write_all(header.data(), header.size());
  for (size_t i = 0; i < ordered.size(); ++i) write_all(ordered[i]->data, sizes[i]);
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temp.c_str());
    throw FormatError(temp.string() + ": could not be flushed to disk (" + reason + ")");
  }
  // POSIX rename: atomic within one filesystem, and independent of which
  // library's std::filesystem a process happens to bind.
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temp.c_str());
    throw FormatError(path.string() + ": could not be replaced (" + reason + ")");
  }
}

}  // namespace dflash::sdk::safetensors
