#include "eval/prompts.h"

#include "text/tokenizer.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>

#include <unistd.h>

namespace dflash::eval {
namespace fs = std::filesystem;
namespace {

std::string where(const std::string& file, int64_t line) { return file + ":" + std::to_string(line); }

std::vector<int64_t> id_list(const nlohmann::json& value, const std::string& at, const char* key, int64_t vocab) {
  if (!value.is_array()) throw std::invalid_argument(at + ": \"" + key + "\" must be a list of token ids");
  std::vector<int64_t> ids;
  for (const auto& v : value) {
    if (!v.is_number_integer()) throw std::invalid_argument(at + ": \"" + key + "\" holds a non-integer: " + v.dump());
    // An id past int64 (JSON's unsigned 2^64 − 1) is named as written, not
    // as the negative number a conversion would make of it.
    const bool beyond = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
    const int64_t id = beyond ? -1 : v.get<int64_t>();
    if (beyond || id < 0 || (vocab > 0 && id >= vocab))
      throw std::invalid_argument(at + ": \"" + key + "\" holds id " + v.dump() + ", outside the target's vocabulary [0, " +
                                  std::to_string(vocab) + ")");
    ids.push_back(id);
  }
  return ids;
}

// The target's tokenizer, loaded at the first text prompt from the file its
// plugin names ("tokenizer": {"type": "huggingface", "path": ...}).
const text::Tokenizer& target_tokenizer(std::optional<text::Tokenizer>& loaded, const nlohmann::json& target_info,
                                        const std::string& at) {
  if (loaded) return *loaded;
  const nlohmann::json t = target_info.value("tokenizer", nlohmann::json());
  if (!t.is_object() || !t.contains("path") || !t["path"].is_string())
    throw std::invalid_argument(at + ": a text prompt needs a tokenizer, and the target describes none (its model folder "
                                     "has no tokenizer.json); give \"prompt_ids\" instead");
  try {
    loaded = text::Tokenizer::load(t["path"].get<std::string>());
  } catch (const text::TokenizerError& e) {
    throw std::invalid_argument(at + ": a text prompt needs the target's tokenizer, which cannot be used: " + e.what());
  }
  return *loaded;
}

// Where the answer of a training line starts: its first supervised position,
// or its length when nothing is supervised (all of it is context).
size_t first_supervised(const nlohmann::json& mask, size_t length, const std::string& at) {
  if (!mask.is_array()) throw std::invalid_argument(at + ": \"loss_mask\" must be a list of 0s and 1s");
  if (mask.size() != length)
    throw std::invalid_argument(at + ": \"loss_mask\" has " + std::to_string(mask.size()) + " entries, \"input_ids\" " +
                                std::to_string(length) + "; give one per token");
  for (size_t i = 0; i < mask.size(); ++i) {
    const nlohmann::json& m = mask[i];
    const bool one = m.is_boolean() ? m.get<bool>() : (m.is_number_integer() && m.get<int64_t>() == 1);
    const bool zero = m.is_boolean() ? !m.get<bool>() : (m.is_number_integer() && m.get<int64_t>() == 0);
    if (!one && !zero) throw std::invalid_argument(at + ": \"loss_mask\"[" + std::to_string(i) + "] is " + m.dump() + ", not 0 or 1");
    if (one) return i;
  }
  return length;
}

}  // namespace

void check_prompts_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status))
    throw std::invalid_argument(path + ": no such prompts file; give a JSON-lines file of prompts");
  if (fs::is_directory(status))
    throw std::invalid_argument(path + " is a directory, not a prompts file; give a JSON-lines file of prompts "
                                "(one {\"prompt_ids\": [...]}, {\"input_ids\": [...]} or {\"text\": \"...\"} per line)");
  if (!fs::is_regular_file(status))
    throw std::invalid_argument(path + " is not a regular file (a pipe or a device); give a JSON-lines file of prompts");
  if (::access(path.c_str(), R_OK) != 0)
    throw std::invalid_argument(path + ": cannot read the prompts file (" + std::strerror(errno) + "); fix its permissions");
}

void check_output_file(const std::string& path, const std::string& flag) {
  const std::string example = flag == "--report" ? "runs/report.json" : "runs/out.jsonl";
  if (path.empty()) throw std::invalid_argument(flag + " needs a file name, e.g. " + flag + " " + example);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status))
    throw std::invalid_argument(flag + " " + path + " is a directory; give a file name, e.g. " + flag + " " +
                                (fs::path(path) / fs::path(example).filename()).string());
  if (fs::exists(status)) {
    if (::access(path.c_str(), W_OK) != 0)
      throw std::invalid_argument(flag + " " + path + ": cannot write it (" + std::strerror(errno) +
                                  "); choose another file or fix its permissions");
    return;
  }
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec))
    throw std::invalid_argument(flag + " " + path + ": the folder " + parent.string() +
                                " does not exist; create it first (mkdir -p " + parent.string() + ") or choose another path");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw std::invalid_argument(flag + " " + path + ": cannot create a file in " + parent.string() + " (" +
                                std::strerror(errno) + "); choose another path or fix the folder's permissions");
}

std::vector<Prompt> read_prompts(const PromptSettings& s, const nlohmann::json& target_info) {
  check_prompts_file(s.file);
  std::ifstream in(s.file);
  if (!in) throw std::invalid_argument(s.file + ": cannot open the prompts file");
  const int64_t vocab = target_info.value("vocab_size", int64_t{0});
  std::optional<text::Tokenizer> tokenizer;
  std::vector<Prompt> prompts;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = where(s.file, line);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument(at + ": not a JSON object (" + std::string(e.what()) + ")");
    }
    if (!j.is_object()) throw std::invalid_argument(at + ": not a JSON object");
    Prompt p;
    p.line = line;
    if (j.contains("prompt_ids")) {
      p.ids = id_list(j["prompt_ids"], at, "prompt_ids", vocab);
    } else if (j.contains("input_ids")) {
      p.ids = id_list(j["input_ids"], at, "input_ids", vocab);
      if (s.split_at_loss_mask && j.contains("loss_mask")) {
        p.ids.resize(first_supervised(j["loss_mask"], p.ids.size(), at));
        if (p.ids.empty())
          throw std::invalid_argument(at + ": \"loss_mask\" supervises the first token, so no prompt precedes the answer; "
                                           "mask the prompt's tokens with 0");
      } else if (static_cast<int64_t>(p.ids.size()) > s.prompt_tokens) {
        p.ids.resize(static_cast<size_t>(s.prompt_tokens));
      }
    } else if (j.contains("text")) {
      if (!j["text"].is_string()) throw std::invalid_argument(at + ": \"text\" must be a string");
      // add_special_tokens: the template's BOS (Llama-3, the quickstart), as the model saw text in training.
      const text::Tokenizer& t = target_tokenizer(tokenizer, target_info, at);
      p.ids = t.encode(j["text"].get<std::string>(), /*add_special_tokens=*/true);
      for (int64_t id : p.ids)
        if (vocab > 0 && id >= vocab)
          throw std::invalid_argument(at + ": the tokenizer " + t.source().string() + " gives id " + std::to_string(id) +
                                      ", outside the target's vocabulary [0, " + std::to_string(vocab) +
                                      "): the tokenizer and config.json are not of the same model");
    } else {
      throw std::invalid_argument(at + ": needs \"prompt_ids\", \"input_ids\" or \"text\"");
    }
    if (p.ids.empty()) throw std::invalid_argument(at + ": the prompt is empty; give at least one token");
    prompts.push_back(std::move(p));
    if (s.max_prompts > 0 && static_cast<int64_t>(prompts.size()) >= s.max_prompts) break;
  }
  if (prompts.empty()) throw std::invalid_argument(s.file + ": holds no prompts");
  return prompts;
}

}  // namespace dflash::eval
