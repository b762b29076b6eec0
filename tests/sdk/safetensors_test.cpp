// Our safetensors reader and writer: round trips, and every malformed file
// refused with a message naming the file and the tensor.
#include "support/expect.h"
#include "support/temp_dir.h"

#include <dflash/sdk/safetensors_torch.hpp>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>
#include <memory>

namespace fs = std::filesystem;
namespace st = dflash::sdk::safetensors;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    temp_ = std::make_unique<dflash::test::TempDir>("dflash_st");
    dir_ = temp_->path();
  }
  void TearDown() override { temp_.reset(); }

  // A file from a raw header and data section.
  fs::path raw(const std::string& name, const std::string& header, const std::string& data, int64_t length = -1) {
    const fs::path file = dir_ / name;
    std::ofstream out(file, std::ios::binary);
    const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << data;
    return file;
  }
  std::string error_of(const fs::path& file) {
    try {
      st::File::open(file);
    } catch (const st::FormatError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a FormatError for " << file;
    return "";
  }
  std::unique_ptr<dflash::test::TempDir> temp_;
  fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeWithMetadataZeroCopy) {
  torch::manual_seed(0);
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"model.embed_tokens.weight", torch::randn({7, 3}).to(torch::kBFloat16)},
      {"f32", torch::randn({2, 3, 4})},
      {"f64", torch::randn({5}, torch::kDouble)},
      {"f16", torch::randn({3}).to(torch::kHalf)},
      {"i64", torch::arange(6, torch::kLong).view({2, 3})},
      {"i32", torch::arange(4, torch::kInt)},
      {"u8", torch::arange(5, torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.5)},
      {"empty", torch::zeros({0, 4})},
      {"transposed", torch::arange(6, torch::kFloat).view({2, 3}).t()},
  };
  const fs::path file = dir_ / "model.safetensors";
  st::save_tensors(file, tensors, {{"format", "pt"}});
  auto loaded = st::File::open(file);
  EXPECT_EQ(loaded->metadata().at("format"), "pt");
  EXPECT_EQ(loaded->tensors().size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor back = st::load_tensor(loaded, name);
    EXPECT_EQ(back.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(back, tensor.contiguous())) << name;
  }
  // Zero copy: the tensor aliases the mapping, and outlives the File handle.
  const at::Tensor f32 = st::load_tensor(loaded, "f32");
  EXPECT_EQ(f32.data_ptr(), static_cast<void*>(loaded->data(loaded->at("f32"))));
  loaded.reset();
  EXPECT_TRUE(torch::equal(f32, tensors[1].second));
  // Copy-on-write: writing to a loaded tensor never changes the file.
  at::Tensor writable = st::load_tensor(st::File::open(file), "i64");
  writable.fill_(-1);
  EXPECT_TRUE(torch::equal(st::load_tensor(st::File::open(file), "i64"), tensors[4].second));
}

TEST_F(Safetensors, HeaderIsPaddedAndDataCoversTheFile) {
  const fs::path file = dir_ / "a.safetensors";
  st::save_tensors(file, {{"x", torch::ones({3})}});
  std::ifstream in(file, std::ios::binary);
  uint8_t length[8];
  in.read(reinterpret_cast<char*>(length), 8);
  EXPECT_EQ(length[0] % 8, 0) << "data starts 8-byte aligned";
  EXPECT_EQ(fs::file_size(file), 8u + length[0] + 12u);
}

TEST_F(Safetensors, WritingIsAtomic) {
  const fs::path file = dir_ / "ckpt.safetensors";
  st::save_tensors(file, {{"x", torch::ones({3})}});
  // A failing write (a dtype safetensors cannot hold) leaves the old file intact
  // and no temporary behind.
  EXPECT_THROW(st::save_tensors(file, {{"x", torch::ones({2}, torch::kComplexFloat)}}), st::FormatError);
  EXPECT_TRUE(torch::equal(st::load_tensor(st::File::open(file), "x"), torch::ones({3})));
  for (const auto& entry : fs::directory_iterator(dir_)) EXPECT_EQ(entry.path(), file) << "left behind: " << entry.path();
}

TEST_F(Safetensors, MalformedFilesAreRefusedWithTheFileAndTensorNamed) {
  const std::string ok_entry = R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  const std::string eight(8, '\0');
  struct Bad {
    std::string name, header, data;
    int64_t length;
    std::string expected;
  };
  const std::vector<Bad> cases = {
      {"short.st", "", "", 0, "header length 0"},  // replaced below by a 3-byte file
      {"huge_header.st", "{}", "", 1ll << 40, "exceeds the"},
      {"header_past_end.st", "{}", "", 4096, "larger than the file after it"},
      {"not_json.st", "{\"w\": ", "", -1, "header is not valid JSON"},
      {"not_object.st", "[1, 2]", "", -1, "header is not a JSON object"},
      {"unknown_dtype.st", R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", eight, -1,
       "tensor 'w' has unknown dtype 'Q4'"},
      {"negative_shape.st", R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", eight, -1,
       "tensor 'w' has a shape entry that is not a non-negative integer"},
      {"misshapen.st", R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", eight, -1,
       "tensor 'w' spans 8 bytes, but its shape and dtype need 12"},
      {"truncated.st", "{" + ok_entry + "}", std::string(5, '\0'), -1,
       "tensor 'w' ends at byte 8 of the data, but the file holds only 5 data bytes; the file is truncated"},
      {"reversed.st", R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", eight, -1, "begin > end"},
      {"overlap.st",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       eight, -1, "tensor 'b' overlaps the tensor before it"},
      {"hole.st", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", eight, -1,
       "bytes 0..4 of the data belong to no tensor (a hole before 'a')"},
      {"trailing.st", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", eight, -1,
       "4 bytes after the last tensor belong to no tensor"},
      {"no_offsets.st", R"({"a": {"dtype": "F32", "shape": [1]}})", eight, -1, "tensor 'a' needs data_offsets"},
      {"bad_metadata.st", R"({"__metadata__": {"k": 1}})", "", -1, "__metadata__.k is not a string"},
      // A key twice: the JSON parser kept the last one silently.
      {"duplicate_tensor.st",
       R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
       eight, -1, "header gives the key 'w' twice"},
      {"duplicate_field.st", R"({"w": {"dtype": "I32", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", eight,
       -1, "header gives the key 'dtype' twice"},
  };
  for (const Bad& c : cases) {
    fs::path file = raw(c.name, c.header, c.data, c.length);
    if (c.name == "short.st") {
      std::ofstream(file, std::ios::binary | std::ios::trunc) << "abc";
    }
    const std::string message = error_of(file);
    if (c.name == "short.st") EXPECT_CONTAINS(message, "only 3 bytes");
    else EXPECT_CONTAINS(message, c.expected);
    EXPECT_CONTAINS(message, file.string());
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_CONTAINS(error_of(dir_ / "missing.safetensors"), "cannot open");
}

TEST_F(Safetensors, AMissingTensorIsNamed) {
  const fs::path file = dir_ / "m.safetensors";
  st::save_tensors(file, {{"a", torch::ones({1})}});
  try {
    st::load_tensor(st::File::open(file), "lm_head.weight");
    FAIL();
  } catch (const st::FormatError& e) {
    EXPECT_CONTAINS(e.what(), "no tensor named 'lm_head.weight'");
    EXPECT_CONTAINS(e.what(), file.string());
  }
}

// Every file of the fuzz target's seed corpus parses or is refused cleanly.
TEST(SafetensorsCorpus, SeedsParseOrFailCleanly) {
  size_t seen = 0;
  for (const auto& entry : fs::directory_iterator(DFLASH_FUZZ_CORPUS)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    try {
      st::parse_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), entry.path().string());
    } catch (const st::FormatError&) {
    }
    ++seen;
  }
  EXPECT_GE(seen, 3u);
}

}  // namespace
