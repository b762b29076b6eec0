// `dflash-host prepare`: conversations and texts (JSON lines) → the training
// lines the jsonl data source reads, {"input_ids", "loss_mask"}, or, for
// `generate`, prompts {"prompt_ids"} that end with an open assistant turn.
#pragma once

#include "prepare/chat_format.h"
#include "text/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dflash::prepare {

struct PrepareOptions {
  std::filesystem::path input;   // JSON lines
  std::filesystem::path output;  // written whole, then renamed into place
  std::optional<ChatFormat> format;  // none: only plain texts can be prepared
  std::string no_format_because;     // why there is none, for the error a conversation gets
  bool for_generate = false;          // prompts for `generate` instead of training lines
  std::optional<std::string> system;  // a system message for conversations that have none
  int64_t log_bad_lines = 5;          // bad lines named in the report; the rest are only counted
};

struct PrepareReport {
  int64_t lines = 0;          // non-blank input lines
  int64_t written = 0;        // output lines
  int64_t conversations = 0;  // of those written
  int64_t texts = 0;
  int64_t tokens = 0, supervised = 0;
  std::map<std::string, int64_t> skipped;  // reason → lines
  std::vector<std::string> bad_lines;      // "file:line: what is wrong", the first log_bad_lines
  double seconds = 0;
};

// Checks that the tokenizer knows the format's special tokens (throws
// std::invalid_argument naming the token, the tokenizer file and the format).
void check_tokenizer_has_format(const text::Tokenizer& tokenizer, ChatFormat format);

// Reads every line, skipping and counting bad ones by reason. Throws
// std::runtime_error (with the report's counts) when no line could be used,
// and on I/O errors naming the file; the output then is left as it was.
PrepareReport prepare_file(const text::Tokenizer& tokenizer, const PrepareOptions& options);

// The report as console lines.
std::string format_report(const PrepareReport& report, const PrepareOptions& options);

}  // namespace dflash::prepare
