#include "json/strict_json.h"

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

// The value, built in one pass of nlohmann's SAX parser, checking as it goes
// what nlohmann's own tree builder does not: the depth before a container
// opens, and each object's keys (a second one is refused where std::map would
// keep the first silently). It knows where it is, as a path, to name either.
class TreeBuilder final : public json::json_sax_t {
 public:
  TreeBuilder(std::size_t max_nesting, const std::vector<Stream>& streams)
      : max_nesting_(max_nesting), streams_(streams) {}

  json take_root() { return std::move(root_); }
  bool failed() const { return failed_; }
  std::size_t error_byte() const { return error_byte_; }
  const std::string& error_reason() const { return error_reason_; }

  bool null() override { return place(json(nullptr)); }
  bool boolean(bool value) override { return place(json(value)); }
  bool number_integer(number_integer_t value) override { return place(json(value)); }
  bool number_unsigned(number_unsigned_t value) override { return place(json(value)); }
  bool number_float(number_float_t value, const string_t&) override { return place(json(value)); }
  bool string(string_t& value) override { return place(json(std::move(value))); }
  bool binary(binary_t&) override { return place(json()); }  // CBOR and the like only; JSON text has none
  bool start_object(std::size_t) override { return open(false); }
  bool start_array(std::size_t) override { return open(true); }
  bool key(string_t& key) override {
    frames_.back().key = std::move(key);
    return true;
  }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    failed_ = true;
    const auto* syntax = dynamic_cast<const json::parse_error*>(&e);
    const std::size_t byte = syntax ? syntax->byte : position;
    error_byte_ = byte == 0 ? 0 : byte - 1;
    error_reason_ = short_reason(e.what());
    return false;
  }

 private:
  struct Frame {
    json* node = nullptr;      // the container, where it is attached (the tree or an owned member)
    json owned;                // a streamed container's member, built here and handed over whole
    bool owns = false;
    bool is_array = false;
    std::size_t index = 0;     // arrays: elements completed so far
    std::string key;           // objects: the current member's key
    const Stream* stream = nullptr;  // this container's members go to stream->take
    bool in_stream = false;          // it is (inside) a streamed container's member
  };

  json& node(Frame& f) { return f.owns ? f.owned : *f.node; }

  // The stream of a container opening where the frames are now.
  const Stream* stream_at(bool is_array) const {
    for (const Stream& s : streams_) {
      if (s.is_array != is_array || s.keys.size() != frames_.size()) continue;
      bool same = true;
      for (std::size_t i = 0; i < frames_.size() && same; ++i)
        same = !frames_[i].is_array && frames_[i].key == s.keys[i];
      if (same) return &s;
    }
    return nullptr;
  }

  bool open(bool is_array) {
    if (frames_.size() + 1 > max_nesting_) {
      StrictJsonError e(StrictJsonError::Kind::kTooDeep, "the value at \"" + path() + "\" nests more than " +
                                                            std::to_string(max_nesting_) + " objects and arrays deep");
      e.path = path();
      throw e;
    }
    Frame child;
    child.is_array = is_array;
    json empty = is_array ? json::array() : json::object();
    if (frames_.empty()) {
      root_ = std::move(empty);
      child.node = &root_;
    } else {
      Frame& parent = frames_.back();
      child.in_stream = parent.stream != nullptr || parent.in_stream;
      if (parent.stream) {
        child.owned = std::move(empty);
        child.owns = true;
      } else if (parent.is_array) {
        node(parent).push_back(std::move(empty));
        child.node = &node(parent).back();
      } else {
        const auto [it, inserted] = node(parent).emplace(parent.key, std::move(empty));
        if (!inserted) duplicate();
        child.node = &it.value();
      }
    }
    if (!child.in_stream && !streams_.empty()) child.stream = stream_at(is_array);
    frames_.push_back(std::move(child));
    return true;
  }

  bool close() {
    Frame done = std::move(frames_.back());
    frames_.pop_back();
    if (frames_.empty()) return true;
    Frame& parent = frames_.back();
    if (done.owns && !parent.stream->take(parent.key, parent.index, std::move(done.owned))) duplicate();
    if (parent.is_array) ++parent.index;
    return true;
  }

  bool place(json&& value) {
    if (frames_.empty()) {
      root_ = std::move(value);
      return true;
    }
    Frame& f = frames_.back();
    if (f.stream) {
      if (!f.stream->take(f.key, f.index, std::move(value))) duplicate();
    } else if (f.is_array) {
      node(f).push_back(std::move(value));
    } else if (!node(f).emplace(f.key, std::move(value)).second) {
      duplicate();
    }
    if (f.is_array) ++f.index;
    return true;
  }

  [[noreturn]] void duplicate() const {
    StrictJsonError e(StrictJsonError::Kind::kDuplicateKey, "duplicate key \"" + path() + "\"");
    e.path = path();
    e.key = frames_.back().key;
    throw e;
  }

  std::string path() const {
    std::string out;
    for (const Frame& frame : frames_)
      out += frame.is_array ? "[" + std::to_string(frame.index) + "]" : (out.empty() ? "" : ".") + frame.key;
    return out;
  }

  std::size_t max_nesting_;
  const std::vector<Stream>& streams_;
  std::vector<Frame> frames_;
  json root_;
  bool failed_ = false;
  std::size_t error_byte_ = 0;
  std::string error_reason_;
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

json parse_strict(const std::string& text, std::size_t max_nesting, const std::vector<Stream>& streams) {
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    const auto [line, column] = line_and_column(text, nul);
    StrictJsonError e(StrictJsonError::Kind::kNulByte,
                      "a NUL byte at line " + std::to_string(line) + ", column " + std::to_string(column));
    e.line = line;
    e.column = column;
    throw e;
  }
  TreeBuilder builder(max_nesting, streams);
  try {
    json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json, /*strict=*/true,
                    /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw syntax_error(text, 0, e.what());
  }
  if (builder.failed()) throw syntax_error(text, builder.error_byte(), builder.error_reason());
  return builder.take_root();
}

}  // namespace dflash::json_text
