// data/synthetic: deterministic generated sequences for tests and benchmarks,
// packed into batches like real data. Sequence i of epoch e is a pure
// function of (seed, e, i), so any position can be resumed without replay.
//
// structure "markov": each token has `branching` successors drawn once from
// the seed, taken with probabilities ∝ 1, 1/2, 1/4, … — text a drafter can
// learn. "uniform": independent uniform tokens — nothing to learn (timing).
#include "packing.h"

#include <dflash/sdk/splitmix.hpp>
#include <dflash/sdk/data_source.hpp>


namespace {
using namespace dflash;

// Draws from SplitMix64 (sdk/splitmix.hpp), portable across standard libraries.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() { return state_ = sdk::splitmix64(state_); }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

class SyntheticData : public sdk::DataSource {
 public:
  static constexpr sdk::PluginInfo info{"synthetic", "1.0.0",
                                        "deterministic generated sequences (Markov or uniform), packed into batches"};

  static std::string config_schema() {
    using sdk::Bounds;
    return sdk::Schema()
        .integer("vocab_size", 0, "token ids are in [0, vocab_size); 0 = the target's vocabulary size", Bounds::between(0, 1 << 26))
        .integer("sequences", 1024, "sequences per epoch", Bounds::between(1, 1LL << 40))
        .integer("min_length", 64, "shortest sequence", Bounds::between(2, 1 << 24))
        .integer("max_length", 256, "longest sequence (at most row_length)", Bounds::between(2, 1 << 24))
        .number("prompt_fraction", 0.25, "the leading part of each sequence with loss_mask 0", Bounds::between(0, 0.9))
        .string("structure", "markov", "markov: learnable successors; uniform: independent tokens", {"markov", "uniform"})
        .integer("branching", 4, "markov: successors per token", Bounds::between(1, 64))
        .integer("row_length", 512, "tokens per batch row", Bounds::between(2, 1 << 24))
        .integer("tokens_per_batch", 2048, "the batch's token budget: rows = tokens_per_batch / row_length",
                 Bounds::between(2, 1LL << 32))
        .memory_knob("token budget")
        .integer("epochs", 0, "epochs before the data ends (0 = endless)", Bounds::between(0, 1 << 20))
        .dump();
  }

  // The batch shape for the memory planner (ABI 1.2); no file is opened.
  static sdk::MemoryPlan plan_memory(const sdk::PlanRequest& request) {
    return data::packed_batch_plan(request.config(), "data.synthetic");
  }

  explicit SyntheticData(const sdk::CreateContext& context) : seed_(context.seed()) {
    const auto& c = context.config();
    vocab_ = c.at("vocab_size").get<int64_t>();
    sequences_ = c.at("sequences").get<int64_t>();
    min_length_ = c.at("min_length").get<int64_t>();
    max_length_ = c.at("max_length").get<int64_t>();
    prompt_fraction_ = c.at("prompt_fraction").get<double>();
    markov_ = c.at("structure").get<std::string>() == "markov";
    branching_ = c.at("branching").get<int64_t>();
    row_length_ = c.at("row_length").get<int64_t>();
    rows_ = c.at("tokens_per_batch").get<int64_t>() / row_length_;
    epochs_ = c.at("epochs").get<int64_t>();
    auto bad = [](const std::string& key, const std::string& why) {
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "data.synthetic." + key + ": " + why);
    };
    if (vocab_ < 2) bad("vocab_size", "must be at least 2 (0 asks the host for the target's, which must be known)");
    if (min_length_ > max_length_) bad("min_length", "is larger than max_length");
    if (max_length_ > row_length_) bad("max_length", std::to_string(max_length_) + " exceeds row_length " + std::to_string(row_length_));
    if (rows_ < 1) bad("tokens_per_batch", "must be at least row_length (" + std::to_string(row_length_) + ")");
    // The supervised part (length minus prompt) grows with the length, so if
    // the longest sequence has no two supervised tokens none has: every batch
    // would teach nothing. Refused here rather than trained on.
    if (supervised_tokens(max_length_) < 2)
      bad("prompt_fraction", nlohmann::json(prompt_fraction_).dump() + " leaves fewer than 2 supervised tokens even in the longest "
                             "sequence (max_length " + std::to_string(max_length_) +
                             "), so no sequence could be trained on; lower prompt_fraction or raise max_length");
    if (markov_) {
      Random r(sdk::splitmix64(seed_ ^ 0x5eedULL));
      successors_.resize(static_cast<size_t>(vocab_ * branching_));
      for (auto& s : successors_) s = r.below(vocab_);
    }
  }

  std::optional<sdk::TensorDict> next_batch() {
    data::BatchPacker packer(rows_, row_length_, /*pad_id=*/0);
    while (epochs_ == 0 || epoch_ < epochs_) {
      if (!packer.try_add(generate(epoch_, index_))) break;  // batch full: this sequence opens the next one
      if (++index_ == sequences_) {
        index_ = 0;
        ++epoch_;
      }
    }
    if (packer.empty()) return std::nullopt;
    return packer.finish();
  }

  nlohmann::json save_state() const { return {{"epoch", epoch_}, {"index", index_}}; }
  void load_state(const nlohmann::json& state) {
    const auto epoch = state.at("epoch").get<int64_t>(), index = state.at("index").get<int64_t>();
    // An index outside [0, sequences) would never wrap to the next epoch: the data would never end.
    if (epoch < 0 || index < 0 || index >= sequences_)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "data.synthetic: the saved position (epoch " + std::to_string(epoch) +
                                                        ", index " + std::to_string(index) + ") is outside the " +
                                                        std::to_string(sequences_) +
                                                        " sequences per epoch (was data.synthetic.sequences changed, or is the checkpoint damaged?)");
    epoch_ = epoch;
    index_ = index;
  }
  nlohmann::json describe() const {
    return {{"vocab_size", vocab_}, {"sequences", sequences_}, {"epoch", epoch_}, {"rows", rows_}, {"row_length", row_length_}};
  }

 private:
  int64_t supervised_tokens(int64_t length) const {
    return length - static_cast<int64_t>(prompt_fraction_ * static_cast<double>(length));
  }

  data::Sequence generate(int64_t epoch, int64_t index) const {
    Random r(sdk::splitmix64(sdk::splitmix64(seed_) ^ sdk::splitmix64(static_cast<uint64_t>(epoch) * 0x100000001b3ULL + static_cast<uint64_t>(index))));
    const int64_t length = min_length_ + r.below(max_length_ - min_length_ + 1);
    data::Sequence s;
    s.ids.resize(static_cast<size_t>(length));
    s.loss_mask.resize(static_cast<size_t>(length));
    const int64_t prompt = length - supervised_tokens(length);
    int64_t token = r.below(vocab_);
    for (int64_t i = 0; i < length; ++i) {
      s.ids[i] = token;
      s.loss_mask[i] = i >= prompt ? 1 : 0;
      if (markov_) {
        int64_t choice = 0;  // successor k with probability ∝ 2^-k
        while (choice + 1 < branching_ && r.unit() < 0.5) ++choice;
        token = successors_[static_cast<size_t>(token * branching_ + choice)];
      } else {
        token = r.below(vocab_);
      }
    }
    return s;
  }

  uint64_t seed_;
  int64_t vocab_, sequences_, min_length_, max_length_, branching_, row_length_, rows_, epochs_;
  double prompt_fraction_;
  bool markov_;
  std::vector<int64_t> successors_;
  int64_t epoch_ = 0, index_ = 0;
};

}  // namespace

DFLASH_PLUGINS(SyntheticData)
