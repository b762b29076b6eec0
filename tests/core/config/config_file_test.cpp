#include "config/config_file.h"

#include <gtest/gtest.h>

#include "config_error.h"
#include "support/expect.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using dflash::config::apply_override;
using dflash::config::ConfigError;
using dflash::config::load_json_file;
using nlohmann::json;


const fs::path kData = DFLASH_CONFIG_TEST_DATA;


class LoadJsonFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    dir_ = fs::temp_directory_path() /
           ("dflash_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(stamp));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_ / "locked.json", fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  fs::path write(const std::string& name, const std::string& text) {
    const fs::path file = dir_ / name;
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }
  ConfigError load_error(const fs::path& file) {
    return config_error([&] { (void)load_json_file(file); });
  }
  fs::path dir_;
};

// ---------------------------------------------------------------------------
// load_json_file
// ---------------------------------------------------------------------------

TEST_F(LoadJsonFile, ReadsAValidFile) {
  const json root = load_json_file(kData / "valid.json");
  EXPECT_EQ(root["train"]["seed"], 1);
  EXPECT_EQ(root["loss"]["plugin"], "kl");
  EXPECT_EQ(root["loss"]["temperature"], 2.0);
  EXPECT_EQ(root["scheduler"], json::parse(R"({"plugin":"constant"})"));
}

TEST_F(LoadJsonFile, MissingFile) {
  const fs::path file = dir_ / "nope.json";
  const ConfigError e = load_error(file);
  EXPECT_EQ(e.path(), "");
  EXPECT_EQ(std::string(e.what()),
            "config file \"" + file.string() + "\" does not exist; check the path given to --config");
}

TEST_F(LoadJsonFile, DirectoryInsteadOfFile) {
  const ConfigError e = load_error(dir_);
  EXPECT_CONTAINS(e.what(), "config file \"" + dir_.string() + "\" is a directory, not a regular file");
  EXPECT_CONTAINS(e.what(), "check the path given to --config");
}

// Opening a FIFO for reading blocks until a writer comes: it is refused from
// stat alone. Should the loader ever open it, the test writes to the FIFO to
// unblock it after a few seconds and fails, rather than hang.
TEST_F(LoadJsonFile, AFifoIsRefusedWithoutOpeningIt) {
  const fs::path fifo = dir_ / "config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  auto loading = std::async(std::launch::async, [&] { return std::string(load_error(fifo).what()); });
  if (loading.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
    ADD_FAILURE() << "load_json_file blocked on a FIFO";
  }
  const std::string message = loading.get();
  EXPECT_EQ(message, "config file \"" + fifo.string() +
                         "\" is a FIFO (named pipe), not a regular file; check the path given to --config");
}

TEST_F(LoadJsonFile, ADeviceIsRefusedWithoutReadingIt) {
  // /dev/zero never ends: reading it would grow without bound.
  EXPECT_EQ(std::string(load_error("/dev/zero").what()),
            "config file \"/dev/zero\" is a character device, not a regular file; check the path given to --config");
}

TEST_F(LoadJsonFile, AFileAboveTheSizeCapIsRefusedBeforeItIsRead) {
  const fs::path big = write("big.json", "{}");
  fs::resize_file(big, dflash::config::kMaxConfigBytes + 1);  // sparse: nothing is written
  const std::string message = load_error(big).what();
  EXPECT_CONTAINS(message, "config file \"" + big.string() + "\" is 16777217 bytes, more than the 16 MiB");
  EXPECT_CONTAINS(message, "check the path given to --config");
  fs::resize_file(big, dflash::config::kMaxConfigBytes);  // at the cap: read, and refused for its NUL bytes
  EXPECT_CONTAINS(load_error(big).what(), "big.json\": a NUL byte at line 1, column 3; a JSON file is text");
}

// The parser stops at a NUL byte as at the end of the input: what follows
// (here a duplicate key) would be ignored.
TEST_F(LoadJsonFile, ANulByteIsRefused) {
  const fs::path file = write("nul.json", std::string("{\"a\": 1}\n\0{\"a\": 2}", 18));
  EXPECT_EQ(std::string(load_error(file).what()), "config file \"" + file.string() +
                                                      "\": a NUL byte at line 2, column 1; a JSON file is text, "
                                                      "check the path given to --config");
}

TEST_F(LoadJsonFile, UnreadableFile) {
  const fs::path file = write("locked.json", "{}");
  fs::permissions(file, fs::perms::none);
  if (std::ifstream(file).good()) GTEST_SKIP() << "running with rights that ignore file permissions";
  const ConfigError e = load_error(file);
  EXPECT_CONTAINS(e.what(), "cannot read config file \"" + file.string() + "\": Permission denied");
  EXPECT_CONTAINS(e.what(), "check the path given to --config");
}

TEST_F(LoadJsonFile, SyntaxErrorFixtureGivesLineAndColumn) {
  const fs::path file = kData / "syntax_error.json";  // trailing comma: the '}' on line 4, column 3
  const ConfigError e = load_error(file);
  EXPECT_EQ(e.path(), "");
  EXPECT_EQ(std::string(e.what()), "config file \"" + file.string() +
                                       "\": invalid JSON at line 4, column 3: syntax error while parsing object key "
                                       "- unexpected '}'; expected string literal");
}

TEST_F(LoadJsonFile, SyntaxErrorOnALaterLine) {
  const fs::path file = write("bad.json", "{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]\n}\n");
  EXPECT_CONTAINS(load_error(file).what(), "\": invalid JSON at line 3, column 14: syntax error while parsing value");
}

TEST_F(LoadJsonFile, ColumnsCountCharactersNotBytes) {
  const fs::path file = write("utf8.json", "{\"caf\xC3\xA9\": x}");
  EXPECT_CONTAINS(load_error(file).what(), "invalid JSON at line 1, column 10:");
}

TEST_F(LoadJsonFile, CommentsAreRejected) {
  const fs::path file = write("comment.json", "{\n  // the seed\n  \"seed\": 1\n}\n");
  const ConfigError e = load_error(file);
  EXPECT_CONTAINS(e.what(), "invalid JSON at line 2, column 3:");
  EXPECT_CONTAINS(e.what(), "(comments are not allowed in JSON)");
}

TEST_F(LoadJsonFile, EmptyFile) {
  // The reason after the position is nlohmann's own text, which varies by version.
  const std::string message = load_error(write("empty.json", "")).what();
  EXPECT_CONTAINS(message, "empty.json");
  EXPECT_CONTAINS(message, "invalid JSON at line 1, column 1: ");
}

TEST_F(LoadJsonFile, TopLevelMustBeAnObject) {
  const fs::path file = kData / "not_object.json";
  EXPECT_EQ(std::string(load_error(file).what()),
            "config file \"" + file.string() + "\": the top level must be a JSON object ({...}), got array");
  EXPECT_CONTAINS(load_error(write("s.json", "\"x\"")).what(), "got string");
}

TEST_F(LoadJsonFile, DuplicateKeysAreNamedByPath) {
  ConfigError e = load_error(write("dup.json", R"({"loss": {"temperature": 1, "temperature": 2}})"));
  EXPECT_EQ(e.path(), "loss.temperature");
  EXPECT_CONTAINS(e.what(), "duplicate key \"loss.temperature\"");
  e = load_error(write("dup2.json", R"({"data": {"files": [{"name": "a"}, [1, {"x": 1}], {"name": "b", "name": "c"}]}})"));
  EXPECT_EQ(e.path(), "data.files[2].name");
  e = load_error(write("dup3.json", R"({"a": 1, "b": {"a": 2}, "a": 3})"));
  EXPECT_EQ(e.path(), "a");
  // The same key in different objects is fine.
  EXPECT_NO_THROW((void)load_json_file(write("ok.json", R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}]})")));
}

std::string repeat(std::size_t times, const std::string& part) {
  std::string text;
  for (std::size_t i = 0; i < times; ++i) text += part;
  return text;
}

std::string nested(std::size_t levels, const std::string& open, const std::string& leaf, const std::string& close) {
  std::string text;
  for (std::size_t i = 0; i < levels; ++i) text += open;
  text += leaf;
  for (std::size_t i = 0; i < levels; ++i) text += close;
  return text;
}

// 60 000 nested arrays or 100 000 nested objects crashed the host (stack
// overflow in the recursive copies of a json value); the parser now stops at
// kMaxNesting levels and names the file and where.
TEST_F(LoadJsonFile, DeepNestingIsRefusedWhileParsing) {
  using dflash::config::kMaxNesting;
  ConfigError e = load_error(write("arrays.json", "{\"train\": " + nested(60000, "[", "1", "]") + "}"));
  EXPECT_CONTAINS(e.what(), "arrays.json\": the value at \"train" + repeat(kMaxNesting - 1, "[0]") +
                                "\" nests more than 64 objects and arrays deep, the most a configuration may; "
                                "check the file");
  EXPECT_EQ(e.path(), "train" + repeat(kMaxNesting - 1, "[0]"));
  e = load_error(write("objects.json", nested(100000, "{\"a\": ", "1", "}")));
  EXPECT_CONTAINS(e.what(), "objects.json\": the value at \"a.a.a.");
  EXPECT_CONTAINS(e.what(), "nests more than 64 objects and arrays deep");
  // The top-level object and 63 levels under it are fine.
  const json ok = load_json_file(write("ok.json", "{\"a\": " + nested(kMaxNesting - 1, "[", "", "]") + "}"));
  EXPECT_TRUE(ok.at("a").is_array());
}

// ---------------------------------------------------------------------------
// apply_override
// ---------------------------------------------------------------------------

json set(json root, const std::string& assignment) {
  apply_override(root, assignment);
  return root;
}

ConfigError set_error(const json& root, const std::string& assignment) {
  return config_error([&] {
    json copy = root;
    apply_override(copy, assignment);
  });
}

TEST(ApplyOverride, ValueForms) {
  const json r = json::object();
  EXPECT_TRUE(set(r, "a=2")["a"].is_number_integer());
  EXPECT_EQ(set(r, "a=2")["a"], 2);
  EXPECT_EQ(set(r, "a=-0.5")["a"], -0.5);
  EXPECT_EQ(set(r, "a=true")["a"], true);
  EXPECT_TRUE(set(r, "a=null")["a"].is_null());
  EXPECT_EQ(set(r, "a=[1,2]")["a"], json({1, 2}));
  EXPECT_EQ(set(r, "a={\"x\":1}")["a"], json::parse(R"({"x":1})"));
  EXPECT_EQ(set(r, "a=\"quoted\"")["a"], "quoted");
  EXPECT_EQ(set(r, "a=\"2\"")["a"], "2");
  EXPECT_EQ(set(r, "a=kl")["a"], "kl");
  EXPECT_EQ(set(r, "a=")["a"], "");
  EXPECT_EQ(set(r, "a=[1,2")["a"], "[1,2");        // not JSON: kept as text
  EXPECT_EQ(set(r, "a=x=y")["a"], "x=y");           // only the first '=' splits
  EXPECT_EQ(set(r, "a=/tmp/my data")["a"], "/tmp/my data");
}

TEST(ApplyOverride, CreatesIntermediateObjectsAndKeepsSiblings) {
  json root = json::parse(R"({"loss":{"plugin":"kl","temperature":1.0},"train":{"seed":1}})");
  apply_override(root, "loss.temperature=2.5");
  apply_override(root, "loss.optim.beta1=0.8");
  apply_override(root, "scheduler.plugin=constant");
  EXPECT_EQ(root, json::parse(R"({"loss":{"plugin":"kl","temperature":2.5,"optim":{"beta1":0.8}},
                                   "train":{"seed":1},"scheduler":{"plugin":"constant"}})"));
  json null_root;
  apply_override(null_root, "a.b=1");
  EXPECT_EQ(null_root, json::parse(R"({"a":{"b":1}})"));
  json with_null = json::parse(R"({"a":null})");
  apply_override(with_null, "a.b=1");
  EXPECT_EQ(with_null, json::parse(R"({"a":{"b":1}})"));
}

TEST(ApplyOverride, ArrayElements) {
  const json root = json::parse(R"({"loss":{"layers":[1,2]},"data":{"files":[{"path":"a"},{"path":"b"}]},
                                    "m":[[0,1],[2,3]]})");
  EXPECT_EQ(set(root, "loss.layers[1]=5")["loss"]["layers"], json({1, 5}));
  EXPECT_EQ(set(root, "data.files[1].path=c")["data"]["files"][1]["path"], "c");
  EXPECT_EQ(set(root, "data.files[0].weight=0.5")["data"]["files"][0]["weight"], 0.5);
  EXPECT_EQ(set(root, "m[1][0]=9")["m"], json::parse("[[0,1],[9,3]]"));
}

TEST(ApplyOverride, MalformedAssignments) {
  const json root = json::object();
  ConfigError e = set_error(root, "loss.temperature");
  EXPECT_EQ(e.path(), "");
  EXPECT_EQ(std::string(e.what()), "--set 'loss.temperature': missing '='; expected --set key.path=value");
  e = set_error(root, "=2");
  EXPECT_EQ(std::string(e.what()), "--set '=2': empty key before '='; expected --set key.path=value");
  e = set_error(root, "a..b=1");
  EXPECT_EQ(std::string(e.what()),
            "--set 'a..b=1': empty path segment in key \"a..b\"; expected --set name.name[index]...=value");
  EXPECT_CONTAINS(set_error(root, ".a=1").what(), "--set '.a=1': empty path segment in key \".a\"");
  EXPECT_CONTAINS(set_error(root, "a.=1").what(), "--set 'a.=1': empty path segment in key \"a.\"");
  EXPECT_CONTAINS(set_error(root, "[0]=1").what(), "empty path segment");
  EXPECT_CONTAINS(set_error(root, "a[x]=1").what(), "--set 'a[x]=1': bad array index [x] (expected a non-negative integer)");
  EXPECT_CONTAINS(set_error(root, "a[-1]=1").what(), "bad array index [-1]");
  EXPECT_CONTAINS(set_error(root, "a[]=1").what(), "bad array index []");
  EXPECT_CONTAINS(set_error(root, "a[1=1").what(), "unclosed '['");
  EXPECT_CONTAINS(set_error(root, "a]=1").what(), "unmatched ']'");
  EXPECT_CONTAINS(set_error(root, "a[1]b=1").what(), "unexpected 'b' after ']'");
}

TEST(ApplyOverride, DescendingIntoANonObject) {
  const json root = json::parse(R"({"a":{"b":3,"s":"text","l":[1,2]},"t":true})");
  ConfigError e = set_error(root, "a.b.c=1");
  EXPECT_EQ(e.path(), "a.b");
  EXPECT_EQ(std::string(e.what()),
            "--set 'a.b.c=1': cannot set \"a.b.c\" because \"a.b\" is an integer (3), not an object");
  e = set_error(root, "a.s.x=1");
  EXPECT_EQ(e.path(), "a.s");
  EXPECT_CONTAINS(e.what(), "because \"a.s\" is a string (\"text\"), not an object");
  e = set_error(root, "a.l.x=1");
  EXPECT_CONTAINS(e.what(), "because \"a.l\" is an array ([1,2]), not an object");
  e = set_error(root, "t.x=1");
  EXPECT_CONTAINS(e.what(), "because \"t\" is a boolean (true), not an object");
  e = set_error(root, "a.b[0]=1");
  EXPECT_EQ(e.path(), "a.b");
  EXPECT_CONTAINS(e.what(), "cannot set \"a.b[0]\" because \"a.b\" is an integer (3), not an array");
  e = set_error(root, "a.l[0].x=1");
  EXPECT_EQ(e.path(), "a.l[0]");
  EXPECT_CONTAINS(e.what(), "because \"a.l[0]\" is an integer (1), not an object");
  e = set_error(json::array(), "a=1");
  EXPECT_CONTAINS(e.what(), "--set 'a=1': the configuration is an array ([]), not an object");
}

TEST(ApplyOverride, ArrayElementsMustExist) {
  const json root = json::parse(R"({"loss":{"layers":[1,2]}})");
  ConfigError e = set_error(root, "loss.layers[2]=5");
  EXPECT_EQ(e.path(), "loss.layers[2]");
  EXPECT_EQ(std::string(e.what()),
            "--set 'loss.layers[2]=5': \"loss.layers\" has 2 elements, so \"loss.layers[2]\" does not exist; set the "
            "whole array instead");
  e = set_error(root, "loss.heads[0]=5");
  EXPECT_EQ(e.path(), "loss.heads");
  EXPECT_CONTAINS(e.what(), "\"loss.heads\" does not exist, so element [0] cannot be set");
}

// A deep --set value crashed the host as a deep file did; the key path's
// levels count towards the limit too.
TEST(ApplyOverride, DeepValuesAndKeysAreRefused) {
  using dflash::config::kMaxNesting;
  ConfigError e = set_error(json::object(), "train.x=" + nested(100000, "[", "", "]"));
  EXPECT_CONTAINS(e.what(), "--set 'train.x=[[[[");
  EXPECT_CONTAINS(e.what(), "': the value nests more than 62 objects and arrays deep under a key of 2 levels; "
                            "the most a configuration may nest is 64 levels");
  e = set_error(json::object(), "x=" + nested(100000, "{\"a\":", "1", "}"));
  EXPECT_CONTAINS(e.what(), "the value nests more than 63 objects and arrays deep under a key of 1 level");
  std::string key = "a";
  for (std::size_t i = 1; i <= kMaxNesting; ++i) key += ".a";
  EXPECT_CONTAINS(set_error(json::object(), key + "=1").what(), "': the key has 65 levels; the most a configuration "
                                                                "may nest is 64 levels");
  // Exactly at the limit: 1 level of key, 63 of value.
  const json ok = set(json::object(), "x=" + nested(kMaxNesting - 1, "[", "", "]"));
  EXPECT_TRUE(ok.at("x").is_array());
  EXPECT_CONTAINS(set_error(json::object(), "x=" + nested(kMaxNesting, "[", "", "]")).what(), "nests more than 63");
}

TEST(ApplyOverride, RootIsUnchangedOnError) {
  json root = json::parse(R"({"a":{"b":3}})");
  const json before = root;
  EXPECT_THROW(apply_override(root, "x.y.z[0]=1"), ConfigError);
  EXPECT_THROW(apply_override(root, "a.b.c=1"), ConfigError);
  EXPECT_EQ(root, before);
}

}  // namespace
