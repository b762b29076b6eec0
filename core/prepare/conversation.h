// One input line of `prepare`: a conversation or a plain text. Read from
// the layouts datasets ship in:
//   {"messages": [{"role": "user", "content": "..."}, ...]}            OpenAI-style
//   {"conversations": [{"from": "human", "value": "..."}, ...]}         ShareGPT
//   {"text": "..."}                                                     plain text
// An OpenAI content may be a list of parts; its "text" parts are joined.
#pragma once

#include "prepare/chat_format.h"

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

namespace dflash::prepare {

struct Record {
  std::vector<Message> messages;    // a conversation, or
  std::optional<std::string> text;  // a plain text
};

// Throws std::invalid_argument saying what is wrong with the line (the
// caller adds file:line): which key, which message, what was expected.
Record read_record(const nlohmann::json& line);

}  // namespace dflash::prepare
