// core/metrics/tensorboard.h: CRC-32C against its published check value,
// records read back as written, a resumed run keeping only the steps before
// its checkpoint, a torn tail dropped. An independent reader (Debian's protoc
// and python3-crc32c) checks real runs' files: tests/metrics/read_tfevents.py.
#include "metrics/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <unistd.h>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace dflash::metrics;
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tb_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<int64_t> steps_in(const std::string& path) {
  std::vector<int64_t> steps;
  const EventRecords r = read_event_records(path);
  for (size_t i = 1; i < r.payloads.size(); ++i) steps.push_back(event_step(r.payloads[i]));
  return steps;
}

TEST(TensorBoard, Crc32cIsTheCastagnoliChecksum) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, std::strlen(check)), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t c = crc32c(check, 9);
  EXPECT_EQ(masked_crc32c(check, 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, ARecordIsFramedAndItsScalarsEncoded) {
  const std::string payload = scalars_event(1.5, 300, {{"loss", 2.0f}});
  // Event: wall_time (field 1, 64-bit), step (field 2, varint 300 = ac 02), summary (field 5).
  ASSERT_GE(payload.size(), 12u);
  EXPECT_EQ(static_cast<unsigned char>(payload[0]), 0x09);
  double wall = 0;
  std::memcpy(&wall, payload.data() + 1, 8);
  EXPECT_EQ(wall, 1.5);
  EXPECT_EQ(static_cast<unsigned char>(payload[9]), 0x10);
  EXPECT_EQ(static_cast<unsigned char>(payload[10]), 0xac);
  EXPECT_EQ(static_cast<unsigned char>(payload[11]), 0x02);
  EXPECT_EQ(event_step(payload), 300);
  // Summary { value { tag "loss" simple_value 2.0 } }: 2a 0d 0a 0b 0a 04 "loss" 15 <2.0f>.
  const std::string tail = payload.substr(12);
  const unsigned char expected[] = {0x2a, 0x0d, 0x0a, 0x0b, 0x0a, 0x04, 'l', 'o', 's', 's', 0x15, 0x00, 0x00, 0x00, 0x40};
  ASSERT_EQ(tail.size(), sizeof(expected));
  EXPECT_EQ(std::memcmp(tail.data(), expected, sizeof(expected)), 0);
  const std::string record = tfrecord(payload);
  EXPECT_EQ(record.size(), payload.size() + 16);
  uint64_t length = 0;
  std::memcpy(&length, record.data(), 8);
  EXPECT_EQ(length, payload.size());
}

TEST(TensorBoard, MetricsRecordsBecomeScalarsNamedByTheirJsonPaths) {
  const nlohmann::json record = {{"step", 7}, {"loss", 1.25}, {"loss_metrics", {{"kl", {{"ce", 2.5}}}}},
                                 {"slot_accuracy", {0.5, 0.25}}, {"memory_source", "cuda"}, {"fits", true}};
  const auto scalars = scalars_of(record);
  std::map<std::string, float> by_tag(scalars.begin(), scalars.end());
  EXPECT_EQ(by_tag.size(), 5u);
  EXPECT_EQ(by_tag.at("loss"), 1.25f);
  EXPECT_EQ(by_tag.at("loss_metrics/kl/ce"), 2.5f);
  EXPECT_EQ(by_tag.at("slot_accuracy/1"), 0.25f);
  EXPECT_EQ(by_tag.at("fits"), 1.0f);
  EXPECT_EQ(by_tag.count("step"), 0u);
  EXPECT_EQ(by_tag.count("memory_source"), 0u);
}

TEST(TensorBoard, AResumedRunKeepsTheStepsBeforeItsCheckpointAndATornTailIsDropped) {
  TempDir dir;
  std::string path;
  {
    EventFile file(dir.path.string(), 0);
    path = file.path();
    EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
    for (int64_t step = 0; step < 10; ++step) file.write({{"step", step}, {"loss", 10.0 - step}});
  }
  EXPECT_EQ(steps_in(path), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // A kill mid-write: half a record at the end.
  {
    std::ofstream torn(path, std::ios::binary | std::ios::app);
    const std::string next = tfrecord(scalars_event(0, 10, {{"loss", 0.0f}}));
    torn.write(next.data(), static_cast<std::streamsize>(next.size() / 2));
  }
  EXPECT_FALSE(read_event_records(path).clean);
  {
    // Resumed from the checkpoint of step 6: steps 6 … 9 are written again.
    EventFile file(dir.path.string(), 6);
    EXPECT_EQ(file.path(), path);  // the same file, appended to
    EXPECT_TRUE(read_event_records(path).clean);
    for (int64_t step = 6; step < 12; ++step) file.write({{"step", step}, {"loss", 1.0}});
  }
  EXPECT_EQ(steps_in(path), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  const EventRecords records = read_event_records(path);
  EXPECT_TRUE(records.clean);
  EXPECT_NE(records.payloads[0].find("brain.Event:2"), std::string::npos);  // the file-version event first, once
  size_t versions = 0;
  for (const std::string& p : records.payloads) versions += p.find("brain.Event:2") != std::string::npos;
  EXPECT_EQ(versions, 1u);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(TensorBoard, APathThatIsNotAFileIsRefusedByName) {
  TempDir dir;
  fs::create_directories(dir.path / "events.out.tfevents.1.host");
  try {
    EventFile file(dir.path.string(), 0);
    FAIL() << "a directory in the event file's place was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("events.out.tfevents.1.host"), std::string::npos) << e.what();
  }
}

}  // namespace
