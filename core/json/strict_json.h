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
#include <stdexcept>
#include <string>

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

// `text` as one JSON value, at most `max_nesting` objects and arrays deep
// (the top level counts 1). Throws StrictJsonError. A well-formed text costs
// one pass; a duplicate key or a too-deep value takes a second pass over the
// text, which names its path.
nlohmann::json parse_strict(const std::string& text, std::size_t max_nesting);

}  // namespace dflash::json_text
