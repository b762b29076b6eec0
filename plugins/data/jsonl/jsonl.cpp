// data/jsonl: SpecForge-style pre-tokenised JSON lines,
//   {"input_ids": [...], "loss_mask": [...]}
// streamed from a file or a directory of *.jsonl (never held in memory),
// shuffled per epoch with the run's seed, packed into batches by a token
// budget, resumable at any batch boundary.
//
// A bad line is never used silently: each is classified (NUL bytes, not JSON,
// missing or mistyped field, lengths differ, id outside the vocabulary, no
// two consecutive supervised tokens), counted, and either skipped with a log
// line naming file:line (on_bad_line = skip) or stops the run with that
// message (on_bad_line = stop). describe() reports the counts.
//
// An epoch that yields no usable sequence at all stops the run with those
// counts: skipping on would wait forever for a batch (epochs = 0), or end
// the data having given none (epochs > 0).
#include "line_index.h"
#include "packing.h"

#include <dflash/sdk/splitmix.hpp>
#include <dflash/sdk/data_source.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <numeric>

namespace {
using namespace dflash;


class JsonLines : public sdk::DataSource {
 public:
  static constexpr sdk::PluginInfo info{"jsonl", "1.0.0",
                                        "pre-tokenised JSON lines {input_ids, loss_mask}: streamed, shuffled, packed"};

  static std::string config_schema() {
    using sdk::Bounds;
    return sdk::Schema()
        .required_string("path", "a .jsonl file, or a directory whose *.jsonl files are read in name order")
        .integer("vocab_size", 0, "ids must be below this; 0 = the target's vocabulary size", Bounds::between(0, 1 << 26))
        .integer("row_length", 4096, "tokens per batch row (longer sequences: see long_sequences)", Bounds::between(2, 1 << 24))
        .integer("tokens_per_batch", 16384, "the batch's token budget: rows = tokens_per_batch / row_length",
                 Bounds::between(2, 1LL << 32))
        .memory_knob("token budget")
        .boolean("shuffle", true, "a new order every epoch, from the run's seed")
        .integer("epochs", 0, "epochs before the data ends (0 = endless)", Bounds::between(0, 1 << 20))
        .string("on_bad_line", "skip", "skip: count it, log file:line, go on; stop: fail with file:line", {"skip", "stop"})
        .string("long_sequences", "truncate", "a sequence longer than row_length: truncate it or skip it (both counted)",
                {"truncate", "skip"})
        .integer("log_bad_lines", 10, "how many skipped lines to log one by one (all are counted)", Bounds::between(0, 1 << 20))
        .dump();
  }

  // The batch shape for the memory planner (ABI 1.2); no file is opened.
  static sdk::MemoryPlan plan_memory(const sdk::PlanRequest& request) {
    return data::packed_batch_plan(request.config(), "data.jsonl");
  }

  explicit JsonLines(const sdk::CreateContext& context)
      : host_(context.host()), seed_(context.seed()) {
    const auto& c = context.config();
    path_ = c.at("path").get<std::string>();
    vocab_ = c.at("vocab_size").get<int64_t>();
    row_length_ = c.at("row_length").get<int64_t>();
    rows_ = c.at("tokens_per_batch").get<int64_t>() / row_length_;
    shuffle_ = c.at("shuffle").get<bool>();
    epochs_ = c.at("epochs").get<int64_t>();
    stop_on_bad_ = c.at("on_bad_line").get<std::string>() == "stop";
    truncate_long_ = c.at("long_sequences").get<std::string>() == "truncate";
    log_bad_lines_ = c.at("log_bad_lines").get<int64_t>();
    if (vocab_ < 2)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT,
                       "data.jsonl.vocab_size: must be at least 2 (0 asks the host for the target's, which must be known)");
    if (rows_ < 1)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "data.jsonl.tokens_per_batch: must be at least row_length (" +
                                                        std::to_string(row_length_) + ")");
    try {
      index_ = std::make_unique<data::LineIndex>(path_);
    } catch (const std::exception& e) {
      throw sdk::Error(DFLASH_ERR_NOT_FOUND, std::string("data.jsonl.path: ") + e.what());
    }
    if (index_->lines().empty()) throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "data.jsonl.path: " + path_ + " holds no lines");
    if (index_->lines().size() > UINT32_MAX) throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, path_ + ": more than 2^32 lines");
    start_epoch();
  }

  std::optional<sdk::TensorDict> next_batch() {
    if (!no_data_.empty()) throw sdk::Error(DFLASH_ERR_DATA, no_data_);  // once failed, the data stays failed
    data::BatchPacker packer(rows_, row_length_, /*pad_id=*/0);
    while (!finished()) {
      if (!pending_) {
        pending_ = load(index_->lines()[order_[cursor_]]);
        if (!pending_->ok) {  // bad or skipped: consumed, nothing packed
          pending_.reset();
          advance();
          continue;
        }
      }
      if (!packer.try_add(pending_->sequence)) {
        // A loaded sequence is 2..row_length tokens, so an empty batch always
        // takes it; were that ever broken, the data would "end" silently.
        if (packer.empty()) throw sdk::Error(DFLASH_ERR_INTERNAL, "data.jsonl: a sequence did not fit an empty batch");
        break;  // the batch is full; this sequence opens the next
      }
      if (pending_->truncated) ++counts_["truncated"];
      pending_.reset();
      ++counts_["sequences_used"];
      epoch_used_ = true;
      advance();
    }
    if (packer.empty()) return std::nullopt;
    auto batch = packer.finish();
    fill_ = packer.fill_ratio();
    return batch;
  }

  nlohmann::json save_state() const {
    // At a batch boundary a pending sequence is exactly the one at cursor_,
    // re-read on resume; nothing else is in flight.
    return {{"epoch", epoch_}, {"cursor", cursor_}, {"counts", counts_}, {"lines", index_->lines().size()}};
  }

  void load_state(const nlohmann::json& state) {
    const auto lines = state.at("lines").get<uint64_t>();
    if (lines != index_->lines().size())
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "data.jsonl: the saved position is for " + std::to_string(lines) +
                                                        " lines but " + path_ + " now has " +
                                                        std::to_string(index_->lines().size()) +
                                                        "; resuming on changed data would silently change the run");
    epoch_ = state.at("epoch").get<int64_t>();
    cursor_ = state.at("cursor").get<uint64_t>();
    // A damaged state must be refused, not indexed with (a cursor past the end read out of bounds).
    if (epoch_ < 0 || cursor_ >= lines)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "data.jsonl: the saved position (epoch " + std::to_string(epoch_) +
                                                        ", cursor " + std::to_string(cursor_) + ") is outside the " +
                                                        std::to_string(lines) + " lines of " + path_ +
                                                        "; the checkpoint's data state is damaged");
    counts_ = state.at("counts").get<std::map<std::string, int64_t>>();
    pending_.reset();
    start_epoch(/*keep_cursor=*/true);
    // Mid-epoch, the lines before the cursor were used before the save: this
    // epoch is not judged, the next one is (one more pass at worst).
    epoch_judged_ = cursor_ == 0;
  }

  nlohmann::json describe() const {
    nlohmann::json bad = nlohmann::json::object();
    int64_t bad_total = 0;
    for (const auto& [reason, n] : counts_)
      if (reason.rfind("bad: ", 0) == 0) {
        bad[reason.substr(5)] = n;
        bad_total += n;
      }
    return {{"vocab_size", vocab_},
            {"files", index_->files().size()},
            {"sequences", index_->lines().size()},
            {"blank_lines", index_->blank_lines()},
            {"epoch", epoch_},
            {"sequences_used", count("sequences_used")},
            {"bad_lines", bad_total},
            {"bad_lines_by_reason", bad},
            {"truncated", count("truncated")},
            {"skipped_too_long", count("skipped_too_long")},
            {"batch_fill", fill_}};
  }

 private:
  struct Loaded {
    bool ok = false;
    bool truncated = false;  // counted when packed, so a resumed run counts it once
    data::Sequence sequence;
  };

  int64_t count(const std::string& key) const {
    auto it = counts_.find(key);
    return it == counts_.end() ? 0 : it->second;
  }
  int64_t count_bad() const {
    int64_t total = 0;
    for (const auto& [key, n] : counts_)
      if (key.rfind("bad: ", 0) == 0) total += n;
    return total;
  }
  bool finished() const { return epochs_ > 0 && epoch_ >= epochs_; }

  void start_epoch(bool keep_cursor = false) {
    epoch_used_ = false;
    epoch_judged_ = true;
    epoch_start_counts_ = counts_;
    const auto n = static_cast<uint32_t>(index_->lines().size());
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0u);
    if (shuffle_) {  // Fisher–Yates with a stream fixed by (seed, epoch)
      uint64_t state = sdk::splitmix64(seed_ ^ sdk::splitmix64(static_cast<uint64_t>(epoch_) + 0x6a09e667ULL));
      for (uint32_t i = n - 1; i > 0; --i) {
        state = sdk::splitmix64(state);
        std::swap(order_[i], order_[static_cast<uint32_t>(state % (static_cast<uint64_t>(i) + 1))]);
      }
    }
    if (!keep_cursor) cursor_ = 0;
  }

  void advance() {
    if (++cursor_ == order_.size()) {
      if (epoch_judged_ && !epoch_used_) {
        no_data_ = no_usable_sequence();
        --cursor_;  // stay inside the order
        throw sdk::Error(DFLASH_ERR_DATA, no_data_);
      }
      ++epoch_;
      start_epoch();
    }
  }

  // A whole pass gave nothing to train on: the error carries the data report
  // (what describe() counts) and what each reason usually means.
  std::string no_usable_sequence() const {
    // This epoch's counts: the totals may hold earlier epochs too (a resume).
    auto in_epoch = [&](const std::string& key) {
      auto before = epoch_start_counts_.find(key);
      return count(key) - (before == epoch_start_counts_.end() ? 0 : before->second);
    };
    std::string why;
    auto add = [&](int64_t n, const std::string& reason) {
      if (n == 0) return;
      why += (why.empty() ? "" : ", ") + std::to_string(n) + " " + reason;
    };
    for (const auto& [key, n] : counts_)
      if (key.rfind("bad: ", 0) == 0) add(in_epoch(key), key.substr(5));
    add(in_epoch("skipped_too_long"), "longer than row_length (" + std::to_string(row_length_) + ")");
    std::string hints;
    auto hint = [&](const std::string& key, const std::string& text) {
      if (in_epoch(key) > 0) hints += " " + text;
    };
    hint("bad: NUL bytes", "NUL bytes mean binary data: is the file compressed (gzip? decompress it) or corrupted?");
    hint("bad: not a JSON object", "Each line must be one JSON object of plain text; is the file compressed or in another format?");
    hint("bad: id outside the vocabulary", "Are the ids from another tokenizer? The vocabulary size in use is " +
                                               std::to_string(vocab_) + " (data.jsonl.vocab_size; 0 takes the target's).");
    hint("bad: no two consecutive supervised tokens",
         "A sequence needs two consecutive loss_mask 1s" +
             std::string(truncate_long_ ? " after truncation to row_length (" + std::to_string(row_length_) + ")" : "") +
             "; check loss_mask and row_length.");
    hint("skipped_too_long", "Raise row_length or set long_sequences to truncate.");
    hints += compressed_files();
    const bool logged = log_bad_lines_ > 0 && count_bad() > 0;
    return "data.jsonl: " + path_ + ": a whole epoch gave no usable sequence, so there is nothing to train on. " +
           "Data report: " + std::to_string(index_->lines().size()) + " lines in " +
           std::to_string(index_->files().size()) + " file(s) (" + std::to_string(index_->blank_lines()) +
           " blank lines not counted): " + (why.empty() ? "none counted" : why) + "." +
           (logged ? " The first bad lines are logged above as file:line." : "") +
           " Fix the data or the data.jsonl settings." + hints;
  }

  // Names the files that begin with a compressor's magic bytes (a .jsonl.gz
  // renamed, say): the likeliest reason that nothing parses. The error path
  // only, so the cost of opening the files does not matter.
  std::string compressed_files() const {
    static const std::vector<std::pair<std::string, std::string>> magics = {
        {std::string("\x1f\x8b", 2), "gzip (gunzip it)"}, {std::string("\x28\xb5\x2f\xfd", 4), "zstd (unzstd it)"}};
    std::string out;
    int64_t named = 0, more = 0;  // a directory of shards: name a few, count the rest
    for (const auto& name : index_->files()) {
      std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(name.c_str(), "rb"), &std::fclose);
      if (!file) continue;
      char head[4] = {};
      const size_t got = std::fread(head, 1, sizeof head, file.get());
      for (const auto& [magic, what] : magics)
        if (got >= magic.size() && std::string(head, magic.size()) == magic) {
          if (named == 3) {
            ++more;
          } else {
            out += " " + name + " is compressed: " + what + ".";
            ++named;
          }
        }
    }
    if (more > 0) out += " So are " + std::to_string(more) + " more files.";
    return out;
  }

  void bad_line(const data::LineRef& ref, const std::string& reason, const std::string& detail) {
    const std::string where = index_->files()[ref.file] + ":" + std::to_string(ref.line);
    if (stop_on_bad_)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT,
                       where + ": " + detail + " (data.jsonl.on_bad_line is stop; set it to skip to count and skip such lines)");
    ++counts_["bad: " + reason];
    const int64_t total = count_bad();
    if (total <= log_bad_lines_)
      host_->log(DFLASH_LOG_WARN, "jsonl", (where + ": skipped: " + detail).c_str());
    else if (total == log_bad_lines_ + 1)
      host_->log(DFLASH_LOG_WARN, "jsonl", "further bad lines are counted without a log line (see describe)");
  }

  std::string read(const data::LineRef& ref) {
    try {
      return index_->read(ref);
    } catch (const std::runtime_error& e) {
      throw sdk::Error(DFLASH_ERR_IO, std::string("data.jsonl: ") + e.what());
    }
  }

  Loaded load(const data::LineRef& ref) {
    Loaded out;
    const std::string text = read(ref);
    if (const size_t nul = text.find('\0'); nul != std::string::npos) {
      bad_line(ref, "NUL bytes", "a NUL byte at column " + std::to_string(nul + 1) +
                                     ": binary data, not a JSON line (is the file compressed or corrupted?)");
      return out;
    }
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      bad_line(ref, "not a JSON object", "not a JSON object");
      return out;
    }
    auto ids_it = j.find("input_ids"), mask_it = j.find("loss_mask");
    if (ids_it == j.end() || !ids_it->is_array()) {
      bad_line(ref, "no input_ids array", "no \"input_ids\" array");
      return out;
    }
    if (mask_it == j.end() || !mask_it->is_array()) {
      bad_line(ref, "no loss_mask array", "no \"loss_mask\" array");
      return out;
    }
    if (ids_it->size() != mask_it->size()) {
      bad_line(ref, "lengths differ", "input_ids has " + std::to_string(ids_it->size()) + " entries, loss_mask " +
                                          std::to_string(mask_it->size()));
      return out;
    }
    data::Sequence& s = out.sequence;
    s.ids.reserve(ids_it->size());
    s.loss_mask.reserve(mask_it->size());
    for (size_t i = 0; i < ids_it->size(); ++i) {
      const auto& id = (*ids_it)[i];
      const auto& m = (*mask_it)[i];
      if (!id.is_number_integer()) {
        bad_line(ref, "non-integer id", "input_ids[" + std::to_string(i) + "] is not an integer");
        return out;
      }
      const auto value = id.get<int64_t>();
      if (value < 0 || value >= vocab_) {
        bad_line(ref, "id outside the vocabulary", "input_ids[" + std::to_string(i) + "] = " + std::to_string(value) +
                                                       " is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
        return out;
      }
      if (!(m.is_number_integer() || m.is_boolean()) || (m.is_number_integer() && m.get<int64_t>() != 0 && m.get<int64_t>() != 1)) {
        bad_line(ref, "loss_mask not 0/1", "loss_mask[" + std::to_string(i) + "] is not 0 or 1");
        return out;
      }
      s.ids.push_back(value);
      s.loss_mask.push_back(m.is_boolean() ? (m.get<bool>() ? 1 : 0) : static_cast<uint8_t>(m.get<int64_t>()));
    }
    if (static_cast<int64_t>(s.ids.size()) > row_length_) {
      if (!truncate_long_) {
        ++counts_["skipped_too_long"];
        return out;
      }
      s.ids.resize(static_cast<size_t>(row_length_));
      s.loss_mask.resize(static_cast<size_t>(row_length_));
      out.truncated = true;
    }
    if (!data::has_supervised_pair(s.loss_mask)) {
      bad_line(ref, "no two consecutive supervised tokens",
               "no two consecutive supervised tokens (loss_mask), so no anchor can be drawn from it");
      return out;
    }
    out.ok = true;
    return out;
  }

  const dflash_host_api* host_;
  uint64_t seed_;
  std::string path_;
  int64_t vocab_, row_length_, rows_, epochs_, log_bad_lines_;
  bool shuffle_, stop_on_bad_, truncate_long_;
  std::unique_ptr<data::LineIndex> index_;
  std::vector<uint32_t> order_;
  uint64_t cursor_ = 0;
  int64_t epoch_ = 0;
  std::optional<Loaded> pending_;
  bool epoch_used_ = false;   // a sequence of this epoch went into a batch
  bool epoch_judged_ = true;  // this epoch was seen from its start
  std::map<std::string, int64_t> epoch_start_counts_;  // counts_ when this epoch began, for its report
  std::string no_data_;       // set when an epoch gave nothing: every later call fails with it
  std::map<std::string, int64_t> counts_;
  double fill_ = 0;
};

}  // namespace

DFLASH_PLUGINS(JsonLines)
