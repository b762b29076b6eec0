// TensorBoard event files beside metrics.jsonl (issue 44): each step's
// record as scalar summaries, in the format TensorBoard and every reader of
// it load — TFRecord framing (a little-endian uint64 length, the masked
// CRC-32C of those 8 bytes, the payload, the payload's masked CRC-32C), each
// payload one `Event` protocol buffer.
//
// The three messages it writes are encoded here by hand (the protobuf wire
// format's varints, 64-bit, 32-bit and length-delimited fields): Debian's
// protobuf C++ runtime would be a second protobuf in a process whose
// LibTorch wheel carries its own, for three messages of a few fields; and
// Debian packages no CRC-32C library for C++. What is written is checked by
// an independent reader in CI (tests/metrics/read_tfevents.py: Debian's
// protoc --decode_raw and python3-crc32c).
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dflash::metrics {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and TFRecord's mask
// of it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

// One record's framing around `payload`.
std::string tfrecord(const std::string& payload);

// The Event payloads: the file's first (file_version "brain.Event:2") and
// one step's scalars.
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);

// A metrics record's numbers as TensorBoard scalars, tags being their JSON
// paths joined by '/' (metrics.jsonl's names: "loss",
// "loss_metrics/fused_ckpt_kl/ce", "slot_accuracy/3", "ranks/1/step_ms").
// Booleans count as 0/1; strings, nulls and "step" itself are left out.
std::vector<std::pair<std::string, float>> scalars_of(const nlohmann::json& record, const std::string& prefix = "");

// The run's event file, written by one process (rank 0). Opening it in a
// run folder takes the folder's existing events.out.tfevents.* file if any,
// keeping only its whole records whose step is below first_step (a resumed
// run rewrites what came after its checkpoint, through a temporary file and
// a rename, as metrics.jsonl does); a torn last record is dropped. Each step
// is one write of whole records, so a killed run leaves a readable file.
class EventFile {
 public:
  EventFile(const std::string& directory, int64_t first_step);
  ~EventFile();
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  // The record's scalars at its "step", with the wall time now; on a failed
  // write truncates back to the last whole record and throws
  // MetricsWriteError (progress.h), as metrics.jsonl does.
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A new event file at `path` (replacing one there) holding the file-version
// event and one step's scalars: what `eval --report FILE` writes beside its
// report. Throws naming the file when it cannot be written.
void write_event_file(const std::string& path, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);

// A file's records as payloads, in order, stopping at the first torn or
// corrupt one (its offset in `valid_bytes`). For the rewrite above and the tests.
struct EventRecords {
  std::vector<std::string> payloads;
  uint64_t valid_bytes = 0;
  bool clean = true;  // false: something after valid_bytes was not a whole record
};
EventRecords read_event_records(const std::string& path);

// The step of an Event payload (0 when it has none, as the file-version event).
int64_t event_step(const std::string& payload);

}  // namespace dflash::metrics
