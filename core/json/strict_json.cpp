#include "json/strict_json.h"

#include <set>
#include <utility>
#include <vector>

namespace dflash::json_text {

using nlohmann::json;

namespace {

// nlohmann's message without its "[json.exception.parse_error.101] parse error at …: " head.
std::string short_reason(const std::string& what) {
  const std::size_t head = what.find("parse error");
  if (head == std::string::npos) return what;
  const std::size_t colon = what.find(": ", head);
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

bool opens(json::parse_event_t event) {
  return event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
}

struct Found {};  // the fast pass saw a duplicate key or a too-deep value

// The fast pass: depth, and keys counted per object (an object that ends
// with fewer members than keys were read had a key twice).
class CountingCheck {
 public:
  explicit CountingCheck(std::size_t max_nesting) : max_nesting_(max_nesting) {}
  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    if (opens(event) && static_cast<std::size_t>(depth) + 1 > max_nesting_) throw Found{};
    switch (event) {
      case json::parse_event_t::object_start:
        keys_.push_back(0);
        break;
      case json::parse_event_t::key:
        ++keys_.back();
        break;
      case json::parse_event_t::object_end:
        if (parsed.size() != keys_.back()) throw Found{};
        keys_.pop_back();
        break;
      default:
        break;
    }
    return true;
  }

 private:
  std::size_t max_nesting_;
  std::vector<std::size_t> keys_;
};

// The slow pass, over a text that has a duplicate or a too-deep value: where
// the parser is, as a path, to name it.
class PathCheck {
 public:
  explicit PathCheck(std::size_t max_nesting) : max_nesting_(max_nesting) {}
  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    if (opens(event) && static_cast<std::size_t>(depth) + 1 > max_nesting_) {
      StrictJsonError e(StrictJsonError::Kind::kTooDeep, "the value at \"" + path() + "\" nests more than " +
                                                            std::to_string(max_nesting_) + " objects and arrays deep");
      e.path = path();
      throw e;
    }
    switch (event) {
      case json::parse_event_t::object_start:
        frames_.push_back(Frame{false, 0, {}, {}});
        break;
      case json::parse_event_t::array_start:
        frames_.push_back(Frame{true, 0, {}, {}});
        break;
      case json::parse_event_t::key: {
        Frame& frame = frames_.back();
        frame.key = parsed.get<std::string>();
        if (!frame.keys.insert(frame.key).second) {
          StrictJsonError e(StrictJsonError::Kind::kDuplicateKey, "duplicate key \"" + path() + "\"");
          e.path = path();
          e.key = frame.key;
          throw e;
        }
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        element_done();
        break;
      case json::parse_event_t::value:
        element_done();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool is_array;
    std::size_t index;           // arrays: elements completed so far
    std::set<std::string> keys;  // objects: keys seen so far
    std::string key;             // objects: the current member's key
  };
  void element_done() {
    if (!frames_.empty() && frames_.back().is_array) ++frames_.back().index;
  }
  std::string path() const {
    std::string out;
    for (const Frame& frame : frames_)
      out += frame.is_array ? "[" + std::to_string(frame.index) + "]" : (out.empty() ? "" : ".") + frame.key;
    return out;
  }

  std::size_t max_nesting_;
  std::vector<Frame> frames_;
};

StrictJsonError syntax_error(const std::string& text, std::size_t index, const std::string& reason) {
  const auto [line, column] = line_and_column(text, index);
  StrictJsonError e(StrictJsonError::Kind::kSyntax,
                    "invalid JSON at line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + reason);
  e.line = line;
  e.column = column;
  e.reason = reason;
  e.at_end = index + 1 >= text.size();
  e.at_slash = index < text.size() && text[index] == '/';
  return e;
}

}  // namespace

std::pair<std::size_t, std::size_t> line_and_column(const std::string& text, std::size_t index) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < index && i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      ++line;
      column = 1;
    } else if ((c & 0xC0U) != 0x80U) {
      ++column;
    }
  }
  return {line, column};
}

json parse_strict(const std::string& text, std::size_t max_nesting) {
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    const auto [line, column] = line_and_column(text, nul);
    StrictJsonError e(StrictJsonError::Kind::kNulByte,
                      "a NUL byte at line " + std::to_string(line) + ", column " + std::to_string(column));
    e.line = line;
    e.column = column;
    throw e;
  }
  try {
    return json::parse(text.begin(), text.end(), CountingCheck(max_nesting), /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const json::parse_error& e) {
    throw syntax_error(text, e.byte == 0 ? 0 : e.byte - 1, short_reason(e.what()));
  } catch (const Found&) {
    // Parsed again, slowly, up to the value that stopped the fast pass.
    const json again = json::parse(text.begin(), text.end(), PathCheck(max_nesting), /*allow_exceptions=*/true,
                                   /*ignore_comments=*/false);
    (void)again;
    throw std::logic_error("parse_strict: the second pass found nothing the first one did");
  } catch (const json::exception& e) {
    throw syntax_error(text, 0, e.what());
  }
}

}  // namespace dflash::json_text
