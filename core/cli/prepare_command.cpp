// `dflash-host prepare`: conversations or texts → training lines (or prompts
// for generate) in the model's chat format. Needs a tokenizer and nothing
// else: no weights are loaded, no device is touched.
#include "cli/commands.h"
#include "eval/prompts.h"
#include "prepare/prepare.h"

#include <filesystem>
#include <iostream>
#include <stdexcept>

namespace dflash::cli {
namespace fs = std::filesystem;
namespace {

void check_input_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw std::invalid_argument("--input " + path + ": no such file");
  if (fs::is_directory(status)) throw std::invalid_argument("--input " + path + " is a directory; give a JSON-lines file");
  if (!fs::is_regular_file(status))
    throw std::invalid_argument("--input " + path + " is not a regular file (a pipe or a device); give a JSON-lines file");
}

void check_prepare_flags(const CliOptions& options) {
  if (!options.input)
    throw std::invalid_argument("prepare needs its input: --input FILE.jsonl (one {\"messages\": [...]}, "
                                "{\"conversations\": [...]} or {\"text\": \"...\"} per line)");
  if (!options.out_dir)
    throw std::invalid_argument(std::string("prepare needs an output file: --out FILE.jsonl (the ") +
                                (options.for_generate ? "prompts" : "training lines") + " it writes)");
  if (!options.tokenizer && !options.config_file)
    throw std::invalid_argument("prepare needs a tokenizer: --tokenizer PATH (a tokenizer.json or a model folder), or "
                                "--config FILE.json whose target names one");
  if (options.chat_format && !prepare::chat_format_from_name(*options.chat_format))
    throw std::invalid_argument("--chat-format " + *options.chat_format + ": takes one of " + prepare::chat_format_names());
  check_input_file(*options.input);
  eval::check_output_file(*options.out_dir, "--out");
  std::error_code ec;
  if (fs::equivalent(*options.input, *options.out_dir, ec))
    throw std::invalid_argument("--out " + *options.out_dir + " is the --input file; write to another file");
  if (options.tokenizer && !fs::exists(*options.tokenizer))
    throw std::invalid_argument("--tokenizer " + *options.tokenizer + " does not exist");
}

// The tokenizer file: --tokenizer, else the one the config's target names.
fs::path tokenizer_path(const CliOptions& options) {
  if (options.tokenizer) return *options.tokenizer;
  const nlohmann::json facts = target_facts(options, find_plugins(options));
  const nlohmann::json tokenizer = facts.value("tokenizer", nlohmann::json());
  if (!tokenizer.is_object() || !tokenizer.contains("path") || !tokenizer["path"].is_string())
    throw std::invalid_argument("the config's target names no tokenizer (its plugin describes none): pass --tokenizer PATH");
  return tokenizer["path"].get<std::string>();
}

// --chat-format, else what the model folder tells. Plain texts need none, so
// a folder that tells nothing is an error only once a conversation comes.
void choose_chat_format(const CliOptions& options, const fs::path& tokenizer, prepare::PrepareOptions& settings) {
  if (options.chat_format) {
    settings.format = prepare::chat_format_from_name(*options.chat_format);
    return;
  }
  try {
    settings.format = prepare::detect_chat_format(fs::is_directory(tokenizer) ? tokenizer : tokenizer.parent_path());
  } catch (const std::invalid_argument& e) {
    settings.no_format_because = e.what();
  }
}

}  // namespace

int run_prepare(const CliOptions& options) {
  check_prepare_flags(options);
  const fs::path path = tokenizer_path(options);
  const text::Tokenizer tokenizer = text::Tokenizer::load(path);
  prepare::PrepareOptions settings;
  settings.input = *options.input;
  settings.output = *options.out_dir;
  choose_chat_format(options, path, settings);
  settings.for_generate = options.for_generate;
  settings.system = options.system;
  if (settings.format) {
    try {
      prepare::check_tokenizer_has_format(tokenizer, *settings.format);
    } catch (const std::invalid_argument& e) {
      if (options.chat_format) throw;
      // A guess from the folder that its tokenizer cannot write (a base model
      // of a chat family): plain texts still work.
      settings.format.reset();
      settings.no_format_because = std::string("its folder suggests a chat format its tokenizer cannot write: ") + e.what();
    }
  }
  const prepare::PrepareReport report = prepare::prepare_file(tokenizer, settings);
  std::cout << prepare::format_report(report, settings) << std::endl;
  return kExitOk;
}

}  // namespace dflash::cli
