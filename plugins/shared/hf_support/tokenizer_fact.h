// Where a Hugging Face model folder's tokenizer is, as a target plugin tells
// the host (describe() and plan facts): {"type": "huggingface", "path":
// <absolute path>} naming the folder's tokenizer.json (the host's loader,
// core/text, also reads the quickstart's byte format there), else the folder
// itself when it holds GPT-2's encoder.json + vocab.bpe (or vocab.json +
// merges.txt); null when it has none. The host reads the file; the plugin
// only says where it is.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace dflash::hf {

nlohmann::json tokenizer_fact(const std::string& folder);

}  // namespace dflash::hf
