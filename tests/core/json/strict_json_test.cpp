// parse_strict in one pass: the value it builds, what it refuses and where it
// says it is, and streams (containers handed over member by member).
#include "json/strict_json.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

using dflash::json_text::parse_strict;
using dflash::json_text::Stream;
using dflash::json_text::StrictJsonError;
using nlohmann::json;

namespace {

// The error parsing `text` gives; the test fails if it parses.
StrictJsonError error_of(const std::string& text, std::size_t max_nesting = 64, const std::vector<Stream>& streams = {}) {
  try {
    parse_strict(text, max_nesting, streams);
  } catch (const StrictJsonError& e) {
    return e;
  }
  ADD_FAILURE() << text << " parsed";
  return StrictJsonError(StrictJsonError::Kind::kSyntax, "");
}

// Members taken by a stream, in order, as "key|index|value".
struct Taken {
  std::vector<std::string> members;
  std::vector<std::string> keys_seen;
  Stream stream(std::vector<std::string> keys, bool is_array) {
    return Stream{std::move(keys), is_array, [this](std::string& key, std::size_t index, json&& value) {
                    for (const std::string& k : keys_seen)
                      if (!key.empty() && k == key) return false;
                    keys_seen.push_back(key);
                    members.push_back(key + "|" + std::to_string(index) + "|" + value.dump());
                    return true;
                  }};
  }
};

}  // namespace

TEST(StrictJson, BuildsTheValueAsNlohmannDoes) {
  const std::string text =
      R"({"a": [1, -2, 3.5, "x", true, null, {"b": []}], "c": {"d": {"e": "\u00e9"}}, "f": 18446744073709551615})";
  EXPECT_EQ(parse_strict(text, 64), json::parse(text));
  EXPECT_EQ(parse_strict("[]", 64), json::array());
  EXPECT_EQ(parse_strict(" 7 ", 64), json(7));
  EXPECT_EQ(parse_strict("\"s\"", 64), json("s"));
}

TEST(StrictJson, RefusesAndSaysWhere) {
  StrictJsonError e = error_of(R"({"a": {"b": [1, {"c": 1, "c": 2}]}})");
  EXPECT_EQ(e.kind, StrictJsonError::Kind::kDuplicateKey);
  EXPECT_EQ(e.path, "a.b[1].c");
  EXPECT_EQ(e.key, "c");
  // A container written twice under one key is refused as it opens.
  e = error_of(R"({"x": 1, "x": [2]})");
  EXPECT_EQ(e.kind, StrictJsonError::Kind::kDuplicateKey);
  EXPECT_EQ(e.path, "x");

  e = error_of(R"({"a": [[[1]]]})", 3);
  EXPECT_EQ(e.kind, StrictJsonError::Kind::kTooDeep);
  EXPECT_EQ(e.path, "a[0][0]");  // the top level, a, a[0] fill three levels
  EXPECT_NO_THROW(parse_strict(R"({"a": [[1]]})", 3));

  e = error_of("{\"a\":\n  [1,, 2]}");
  EXPECT_EQ(e.kind, StrictJsonError::Kind::kSyntax);
  EXPECT_EQ(e.line, 2u);
  EXPECT_EQ(e.column, 6u);
  EXPECT_FALSE(e.at_end);
  EXPECT_TRUE(error_of("{\"a\": [1, 2").at_end);
  EXPECT_TRUE(error_of("{\"a\": 1} // note").at_slash);
  EXPECT_EQ(error_of(std::string("[1]\0", 4)).kind, StrictJsonError::Kind::kNulByte);
  EXPECT_EQ(error_of("[1] [2]").kind, StrictJsonError::Kind::kSyntax);  // one value, nothing after it
}

TEST(StrictJson, AStreamTakesTheMembersAndTheTreeKeepsTheContainerEmpty) {
  Taken vocab, merges;
  const json root = parse_strict(R"({"model": {"vocab": {"a": 1, "b": 2}, "merges": ["a b", ["a", "b"], {"x": 1}],
                                   "type": "BPE"}, "vocab": {"z": 9}})",
                                 64, {vocab.stream({"model", "vocab"}, false), merges.stream({"model", "merges"}, true)});
  EXPECT_EQ(vocab.members, (std::vector<std::string>{"a|0|1", "b|0|2"}));
  EXPECT_EQ(merges.members, (std::vector<std::string>{"|0|\"a b\"", "|1|[\"a\",\"b\"]", "|2|{\"x\":1}"}));
  EXPECT_EQ(root, json::parse(R"({"model": {"vocab": {}, "merges": [], "type": "BPE"}, "vocab": {"z": 9}})"));
}

TEST(StrictJson, AStreamOfTheOtherKindOrElsewhereLeavesTheValueInTheTree) {
  Taken vocab;
  const json root = parse_strict(R"({"model": {"vocab": ["a", "b"]}, "m": {"model": {"vocab": {"c": 3}}}})", 64,
                                 {vocab.stream({"model", "vocab"}, false)});
  EXPECT_TRUE(vocab.members.empty());
  EXPECT_EQ(root["model"]["vocab"], json::array({"a", "b"}));
  EXPECT_EQ(root["m"]["model"]["vocab"]["c"], 3);
}

TEST(StrictJson, AStreamsRefusalsNameThePathOfTheMember) {
  Taken vocab;
  StrictJsonError e = error_of(R"({"model": {"vocab": {"a": 1, "b": 2, "a": 3}}})", 64, {vocab.stream({"model", "vocab"}, false)});
  EXPECT_EQ(e.kind, StrictJsonError::Kind::kDuplicateKey);
  EXPECT_EQ(e.path, "model.vocab.a");
  EXPECT_EQ(e.key, "a");
  // Inside a streamed member, the tree's own checks hold.
  Taken merges;
  e = error_of(R"({"model": {"merges": ["a b", {"k": 1, "k": 2}]}})", 64, {merges.stream({"model", "merges"}, true)});
  EXPECT_EQ(e.kind, StrictJsonError::Kind::kDuplicateKey);
  EXPECT_EQ(e.path, "model.merges[1].k");
  e = error_of(R"({"model": {"merges": ["a b", "c d", [["x"]]]}})", 4, {merges.stream({"model", "merges"}, true)});
  EXPECT_EQ(e.kind, StrictJsonError::Kind::kTooDeep);
  EXPECT_EQ(e.path, "model.merges[2][0]");
  // A taker's own error passes through and stops the parse.
  const Stream refusing{{"v"}, false, [](std::string& key, std::size_t, json&&) -> bool {
                          throw std::invalid_argument("bad member " + key);
                        }};
  EXPECT_THROW(
      {
        try {
          parse_strict(R"({"v": {"q": 1}})", 64, {refusing});
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "bad member q");
          throw;
        }
      },
      std::invalid_argument);
}
