// Hugging Face tokenizers in C++: BPE, byte-level (GPT-2, Qwen2/Qwen3,
// Llama-3, DeepSeek-V3, gpt-oss) and SentencePiece-style (Gemma 3, Llama-2,
// Mistral), read from tokenizer.json, GPT-2's encoder.json + vocab.bpe pair,
// and the quickstart target's byte tokenizer. Encodes and decodes id for id
// as the Hugging Face `tokenizers` library does; what is supported and what
// is refused: docs/tokenizer.md.
//
// ICU does the Unicode work (the pre-tokenizer's regex, the normalization
// forms); its headers stay in the .cpp files, behind Impl.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dflash::text {

// A tokenizer file that cannot be used: it names the file, the JSON key (e.g.
// "model.merges[12]"; empty when the problem is the file itself) and what to do.
class TokenizerError : public std::runtime_error {
 public:
  TokenizerError(std::filesystem::path file, std::string key, const std::string& message);
  const std::filesystem::path& file() const { return file_; }
  const std::string& key() const { return key_; }

 private:
  std::filesystem::path file_;
  std::string key_;
};

class Tokenizer {
 public:
  // The largest tokenizer file read (tokenizer.json, encoder.json, vocab.bpe):
  // real ones are 1-20 MB; a bigger file is refused before it is read.
  static constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{256} << 20;

  // A tokenizer.json file, or a directory holding tokenizer.json, or one holding
  // GPT-2's encoder.json + vocab.bpe (or vocab.json + merges.txt). Throws
  // TokenizerError (derives std::runtime_error) naming the file, the JSON key and what to do.
  static Tokenizer load(const std::filesystem::path& file_or_dir);

  // Special/added tokens written inside the text are recognised (as HF does with
  // split_special_tokens=false). add_special_tokens: apply the post-processor's
  // template (e.g. Llama-3's BOS), as HF's encode(add_special_tokens=True).
  // Text that is not valid UTF-8 is encoded as if each ill-formed sequence were
  // U+FFFD (the maximal-subpart rule of Rust's from_utf8_lossy and of WHATWG).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = false) const;

  // Bytes of the tokens, as UTF-8 with U+FFFD for any ill-formed sequence (ids
  // that cut a character in two). Ids that name no token are skipped, as HF does.
  // skip_special_tokens: leave out the added tokens marked "special".
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int64_t> token_to_id(std::string_view token) const;  // vocab and added tokens
  std::optional<std::string> id_to_token(int64_t id) const;          // the vocabulary's spelling (e.g. "Ġthe")
  int64_t vocab_size() const;                                        // the largest id + 1, added tokens included
  const std::filesystem::path& source() const;                       // the file it was read from

  // True for added tokens marked "special" (e.g. <|endoftext|>, <|im_start|>).
  bool is_special(int64_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  // Immutable after load, so copies share it; the BPE cache inside is locked.
  std::shared_ptr<const Impl> impl_;
};

}  // namespace dflash::text
