// JSON text read strictly, the one reader for the files a person or a
// download hands the host (configuration files, tokenizer.json): no
// comments, no NUL byte (nlohmann's parser would take it for the end and drop
// the rest), no key twice in one object (JSON keeps the last silently: in a
// vocabulary that loses a token), and a depth limit checked while parsing,
// before any recursive copy of the value. Callers name their file and add
// their advice; where (line and column, the path of a value) comes from here.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::json_text {

class StrictJsonError : public std::runtime_error {
 public:
  enum class Kind { kNulByte, kSyntax, kTooDeep, kDuplicateKey };
  StrictJsonError(Kind kind, const std::string& message) : std::runtime_error(message), kind(kind) {}

  Kind kind;
  std::size_t line = 0, column = 0;  // kNulByte, kSyntax: 1-based; the column in characters (UTF-8), not bytes
  std::string reason;                // kSyntax: the parser's reason ("syntax error while parsing value - …")
  bool at_end = false;               // kSyntax: the text ends there (cut short)
  bool at_slash = false;             // kSyntax: the character there is '/' (a comment, which JSON has not)
  std::string path;                  // kTooDeep, kDuplicateKey: the value's path, "loss.weights[2].x"
  std::string key;                   // kDuplicateKey: the key written twice
};

// 1-based line and column (in characters: UTF-8 continuation bytes do not
// count) of byte `index` of `text`.
std::pair<std::size_t, std::size_t> line_and_column(const std::string& text, std::size_t index);

// A container whose members are handed over one by one as they are parsed,
// instead of being stored in the value parse_strict returns (which holds the
// container empty there): a tokenizer.json's vocabulary and merges, 150k to
// 500k members, whose tree of std::map nodes took three times as long to build
// as the text took to scan, and was then copied into the reader's own tables.
struct Stream {
  // Where, as a chain of object keys from the top: {"model", "vocab"}, and
  // what: an object, or an array. Any other value there stays in the tree.
  std::vector<std::string> keys;
  bool is_array = false;
  // One member: an object's (key, value) or an array's (index, value), in
  // the order of the text. Returns false when an object's key was taken
  // before: parse_strict then throws the duplicate-key error, naming it; it
  // may move from `key` only when it returns true. May throw to stop the
  // parse (its own error, which passes through).
  std::function<bool(std::string& key, std::size_t index, nlohmann::json&& value)> take;
};

// `text` as one JSON value, at most `max_nesting` objects and arrays deep
// (the top level counts 1), in one pass. Throws StrictJsonError.
nlohmann::json parse_strict(const std::string& text, std::size_t max_nesting, const std::vector<Stream>& streams = {});

}  // namespace dflash::json_text
