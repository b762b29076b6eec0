// drafter/prompt_lookup: the baseline drafter that needs no training. It
// proposes the tokens that followed the most recent earlier occurrence of
// the context's last n tokens (n from max_ngram down to min_ngram), as in
// prompt-lookup decoding. It trains nothing and reads no target features.
#include <dflash/sdk/drafter.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <vector>

namespace {
using namespace dflash;

class PromptLookupDrafter : public sdk::Drafter {
 public:
  static constexpr sdk::PluginInfo info{"prompt_lookup", "1.0.0",
                                        "baseline drafter: copies what followed the last n-gram's earlier occurrence"};

  static std::string config_schema() {
    using sdk::Bounds;
    return sdk::Schema()
        .integer("block_size", 16, "tokens verified per step: the newest token + block_size − 1 proposals",
                 Bounds::between(2, 256))
        .integer("max_ngram", 3, "longest suffix searched for", Bounds::between(1, 64))
        .integer("min_ngram", 1, "shortest suffix searched for", Bounds::between(1, 64))
        .dump();
  }

  explicit PromptLookupDrafter(const sdk::CreateContext& context)
      : block_size_(context.config().at("block_size").get<int64_t>()),
        max_ngram_(context.config().at("max_ngram").get<int64_t>()),
        min_ngram_(context.config().at("min_ngram").get<int64_t>()) {
    if (min_ngram_ > max_ngram_)
      throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "drafter.min_ngram " + std::to_string(min_ngram_) +
                                                      " is larger than drafter.max_ngram " + std::to_string(max_ngram_));
  }

  sdk::TensorDict parameters() { return {}; }
  void bind_target(const nlohmann::json& target, const sdk::TensorDict&) { vocab_ = target.value("vocab_size", int64_t{0}); }
  sdk::TensorDict forward(const sdk::TensorDict&) {
    throw sdk::Error(DFLASH_ERR_UNIMPLEMENTED,
                     "drafter 'prompt_lookup' has nothing to train; use it with `dflash-host eval` as a baseline");
  }
  nlohmann::json export_config() const {
    return {{"architectures", {"PromptLookup"}},
            {"block_size", block_size_},
            {"target_layer_ids", nlohmann::json::array()},
            {"mask_token_id", nullptr},  // proposals come from the context, not from mask tokens
            {"vocab_size", vocab_},
            {"max_ngram", max_ngram_},
            {"min_ngram", min_ngram_}};
  }

  int64_t draft_begin() {
    contexts_.emplace(next_, std::vector<int64_t>{});
    return next_++;
  }
  void draft_extend(int64_t session, const sdk::TensorDict& inputs) {
    const at::Tensor ids = inputs.at("input_ids").reshape({-1}).to(at::kCPU, at::kLong).contiguous();
    std::vector<int64_t>& tokens = context(session);
    tokens.insert(tokens.end(), ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  }
  at::Tensor draft_propose(int64_t session, const sdk::TensorDict& inputs, int64_t count) {
    std::vector<int64_t> tokens = context(session);
    const at::Tensor last = inputs.at("last_token").reshape({-1}).to(at::kCPU, at::kLong);
    if (last.numel() != 1) throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_propose: last_token must hold one id");
    tokens.push_back(last[0].item<int64_t>());
    const int64_t length = static_cast<int64_t>(tokens.size());
    const int64_t take = std::max<int64_t>(0, std::min(count, block_size_ - 1));
    std::vector<int64_t> proposal;
    for (int64_t n = std::min(max_ngram_, length - 1); n >= min_ngram_ && proposal.empty() && take > 0; --n) {
      // The most recent earlier start i whose n tokens equal the suffix.
      for (int64_t i = length - n - 1; i >= 0; --i) {
        if (!std::equal(tokens.begin() + i, tokens.begin() + i + n, tokens.end() - n)) continue;
        for (int64_t j = i + n; j < length && static_cast<int64_t>(proposal.size()) < take; ++j) proposal.push_back(tokens[j]);
        break;
      }
    }
    at::Tensor out = at::empty({static_cast<int64_t>(proposal.size())}, at::kLong);
    std::copy(proposal.begin(), proposal.end(), out.data_ptr<int64_t>());
    return out;
  }
  void draft_end(int64_t session) { contexts_.erase(session); }

 private:
  std::vector<int64_t>& context(int64_t session) {
    auto it = contexts_.find(session);
    if (it == contexts_.end())
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "no drafting session " + std::to_string(session) + " (ended, or never begun)");
    return it->second;
  }

  int64_t block_size_, max_ngram_, min_ngram_, vocab_ = 0;
  std::map<int64_t, std::vector<int64_t>> contexts_;
  int64_t next_ = 1;
};

}  // namespace

DFLASH_PLUGINS(PromptLookupDrafter)
