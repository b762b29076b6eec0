// Added tokens (tokenizer.json "added_tokens": <|im_start|>, <|eot_id|>, ...)
// found inside text, as HF's AddedVocabulary does: leftmost-longest matches,
// single_word matches only between non-word characters, lstrip/rstrip take
// the whitespace beside the token into it (so that whitespace is not encoded).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dflash::text {

struct AddedToken {
  int64_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = true;  // matched in normalized text (else in the raw text)
};

// A [begin, end) range of the text: an added token (token >= 0, an index into
// the tokens given to the matcher) or text to encode (token < 0).
struct Segment {
  std::size_t begin = 0, end = 0;
  int32_t token = -1;
};

class AddedTokenMatcher {
 public:
  // Finds `pattern` (the token's content, or its normalized form) as tokens[index].
  void add(std::string_view pattern, int32_t index, const AddedToken& token);
  bool empty() const { return nodes_.size() <= 1; }

  // The text cut at the added tokens found in it (HF's find_matches); empty
  // text ranges are left out.
  void split(std::string_view text, std::vector<Segment>& segments) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // byte → node
    int32_t token = -1;                                       // a pattern ends here
  };
  struct Rules {
    bool lstrip = false, rstrip = false, single_word = false;
  };
  int32_t child(int32_t node, unsigned char byte) const;
  // The longest pattern starting at `at`: its token and length (0: none).
  std::pair<int32_t, std::size_t> longest_at(std::string_view text, std::size_t at) const;

  std::vector<Node> nodes_{Node{}};
  std::vector<Rules> rules_;  // by token index
  std::array<bool, 256> first_byte_{};
};

}  // namespace dflash::text
