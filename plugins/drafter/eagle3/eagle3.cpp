// The `eagle3` drafter plugin (issue 43), written against the installed SDK
// as an outside team would write it: EAGLE-3 trained with its training-time
// test over a draft vocabulary (eagle3_model.h, ttt_layout.h,
// draft_vocabulary.h). The host knows nothing of it beyond the ABI: the
// loss scores its rows through its own head (ABI 1.6 loss_heads), the
// teacher through the target's head restricted to the draft vocabulary, and
// its draft vocabulary's maps are checkpoint buffers (ABI 1.6 buffers).
//
// Not yet here: speculative drafting for eval, the export checked against a
// reference implementation, the planner's facts.
#include "draft_vocabulary.h"
#include "eagle3_model.h"
#include "ttt_layout.h"

#include <dflash/sdk.hpp>
#include <dflash/sdk/recipe.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <fstream>
#include <memory>
#include <string>

namespace dflash::eagle3 {
namespace {

constexpr int64_t kFeatureLayers = 3;  // low, middle and high, as EAGLE-3 reads them

// EAGLE-3's default target layers (vLLM's, SGLang's and SpecForge's):
// the outputs of layers 1, L/2 − 1 and L − 4.
std::vector<int64_t> default_layer_ids(int64_t layers) {
  return {std::min<int64_t>(1, layers - 1), std::max<int64_t>(0, layers / 2 - 1), std::max<int64_t>(0, layers - 4)};
}

// The counts file `dflash-host token-counts` writes.
at::Tensor read_token_counts(const std::string& path, int64_t target_vocab) {
  std::ifstream in(path);
  if (!in) throw sdk::Error(DFLASH_ERR_NOT_FOUND, "drafter.token_counts: cannot read " + path +
                                                      " (make it with dflash-host token-counts --config … --out " + path + ")");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "drafter.token_counts: " + path + " is not JSON: " + e.what());
  }
  if (!j.contains("counts") || !j["counts"].is_array())
    throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "drafter.token_counts: " + path + " has no \"counts\" list (dflash-host token-counts writes one)");
  const std::vector<int64_t> counts = j["counts"].get<std::vector<int64_t>>();
  if (static_cast<int64_t>(counts.size()) != target_vocab)
    throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "drafter.token_counts: " + path + " counts " + std::to_string(counts.size()) +
                                                    " tokens, but the target's vocabulary has " + std::to_string(target_vocab) +
                                                    ": it was made for another target");
  return at::tensor(counts, at::kLong);
}

class Eagle3Drafter : public sdk::Drafter {
 public:
  static constexpr sdk::PluginInfo info{"eagle3", "0.1.0",
                                        "EAGLE-3: one Llama layer over three target layers, a draft vocabulary, "
                                        "training-time test"};

  static std::string config_schema() {
    using sdk::Bounds;
    return sdk::Schema()
        .string("token_counts", "",
                "the target tokens' supervised counts (dflash-host token-counts --out FILE): the draft vocabulary is "
                "the draft_vocab_size most frequent; empty = the vocabulary comes from a checkpoint (eval)")
        .integer("draft_vocab_size", 32000, "tokens the drafter's head scores (at most the target's vocabulary)",
                 Bounds::between(1, 1 << 24))
        .integer("ttt_steps", 7, "training-time test: drafting steps unrolled in training", Bounds::between(1, 64))
        .number("ttt_decay", 0.8, "step k's rows weigh ttt_decay^k in the loss", Bounds::between(0.0, 1.0))
        .integer_array("target_layer_ids", {},
                       "the three target layers read (outputs of those decoder layers); empty = 1, L/2 − 1, L − 4 as "
                       "vLLM, SGLang and SpecForge choose them",
                       Bounds::between(0, 1 << 20))
        .integer("num_attention_heads", 0, "0 = the target's", Bounds::between(0, 1 << 12))
        .integer("num_key_value_heads", 0, "0 = the target's", Bounds::between(0, 1 << 12))
        .integer("head_dim", 0, "0 = the target's", Bounds::between(0, 1 << 12))
        .integer("intermediate_size", 0, "the MLP's width; 0 = the target's", Bounds::between(0, 1 << 20))
        .dump();
  }

  explicit Eagle3Drafter(const sdk::CreateContext& c)
      : config_(c.config()),
        seed_(c.seed()),
        device_(sdk::parse_device(c.device())),
        dtype_(sdk::parse_dtype(c.dtype())),
        steps_(config_.at("ttt_steps").get<int64_t>()),
        decay_(config_.at("ttt_decay").get<double>()) {}

  void bind_target(const nlohmann::json& target, const sdk::TensorDict& frozen) {
    const int64_t layers = target.at("num_layers").get<int64_t>();
    target_vocab_ = target.at("vocab_size").get<int64_t>();
    layer_ids_ = config_.at("target_layer_ids").get<std::vector<int64_t>>();
    if (layer_ids_.empty()) layer_ids_ = default_layer_ids(layers);
    if (static_cast<int64_t>(layer_ids_.size()) != kFeatureLayers)
      throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "drafter.target_layer_ids: EAGLE-3 reads 3 target layers, got " +
                                                      std::to_string(layer_ids_.size()));
    for (int64_t id : layer_ids_)
      if (id >= layers)
        throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "drafter.target_layer_ids: layer " + std::to_string(id) +
                                                        " is out of range; the target has " + std::to_string(layers) + " layers");
    auto own_or_target = [&](const char* key, const char* fact) {
      const int64_t own = config_.at(key).get<int64_t>();
      return own > 0 ? own : target.at(fact).get<int64_t>();
    };
    Eagle3Shape s;
    s.hidden = target.at("hidden_size").get<int64_t>();
    s.target_hidden = s.hidden;
    s.feature_layers = kFeatureLayers;
    s.heads = own_or_target("num_attention_heads", "num_attention_heads");
    s.kv_heads = own_or_target("num_key_value_heads", "num_key_value_heads");
    s.head_dim = own_or_target("head_dim", "head_dim");
    s.intermediate = own_or_target("intermediate_size", "intermediate_size");
    s.draft_vocab = config_.at("draft_vocab_size").get<int64_t>();
    s.rms_norm_eps = target.value("rms_norm_eps", 1e-6);
    s.rope_theta = target.value("rope_theta", 10000.0);
    const std::string counts = config_.at("token_counts").get<std::string>();
    if (!counts.empty()) {
      vocabulary_ = draft_vocabulary_from_counts(read_token_counts(counts, target_vocab_), s.draft_vocab);
    } else if (s.draft_vocab > target_vocab_) {
      throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "drafter.draft_vocab_size is " + std::to_string(s.draft_vocab) +
                                                      ", but the target's vocabulary has " + std::to_string(target_vocab_) + " tokens");
    } else {  // a placeholder until a checkpoint's d2t is restored into the buffer
      vocabulary_ = draft_vocabulary_from_counts(at::zeros({target_vocab_}, at::kLong), s.draft_vocab);
    }
    vocabulary_from_counts_ = !counts.empty();
    const auto options = at::TensorOptions().dtype(dtype_).device(device_);
    model_ = std::make_unique<Eagle3Model>(s, options, seed_);
    embed_ = frozen.at("embed_tokens").to(options);
    teacher_head_ = frozen.at("lm_head").to(options).index_select(0, vocabulary_.draft_to_target.to(device_));
    d2t_ = vocabulary_.d2t().to(device_);
    t2d_ = vocabulary_.t2d().to(device_);
    target_to_draft_ = vocabulary_.target_to_draft;
    weights_ = at::pow(decay_, at::arange(steps_, at::kDouble)).to(at::kFloat);
  }

  sdk::TensorDict parameters() {
    sdk::TensorDict out;
    for (const auto& [name, tensor] : bound().parameters()) out.set(name, tensor);
    return out;
  }
  sdk::TensorDict buffers() {
    bound();
    return {{"d2t", d2t_}, {"t2d", t2d_}};
  }
  sdk::TensorDict loss_heads() { return {{"lm_head", bound().lm_head()}, {"teacher_lm_head", teacher_head_}}; }

  sdk::TensorDict forward(const sdk::TensorDict& inputs) {
    const Eagle3Model& model = bound();
    if (!vocabulary_from_counts_)
      throw sdk::Error(DFLASH_ERR_INVALID_CONFIG,
                       "drafter.token_counts is empty: training needs the draft vocabulary; make the counts with "
                       "dflash-host token-counts --config … --out counts.json and set drafter.token_counts");
    const at::Tensor ids = inputs.at("input_ids").to(at::kCPU, at::kLong);
    const at::Tensor loss_mask = inputs.at("loss_mask").to(at::kCPU, at::kLong);
    const int64_t rows = ids.size(0), length = ids.size(1), h = model.shape().hidden;
    at::Tensor positions = inputs.get("position_ids");
    at::Tensor documents = inputs.get("document_ids");
    positions = positions.defined() ? positions.to(at::kCPU, at::kLong) : at::arange(length, at::kLong).expand({rows, length});
    documents = documents.defined() ? documents.to(at::kCPU, at::kLong) : positions.eq(0).to(at::kLong).cumsum(1);
    const TttLayout layout = layout_ttt(ids, positions, documents, loss_mask, steps_);

    std::vector<at::Tensor> features;
    for (int64_t id : layer_ids_) features.push_back(inputs.at("hidden." + std::to_string(id)).to(device_, dtype_));
    const at::Tensor embeddings =
        embed_.index_select(0, layout.tokens.flatten().to(device_)).view({steps_, rows, length, h});
    const at::Tensor out = model.forward_ttt(at::cat(features, -1), embeddings, layout, documents);  // [K, B, S, H]

    // The rows the loss scores: every step's supervised positions whose next
    // token has a draft id (the others have no row in the draft head).
    const at::Tensor targets = layout.targets.flatten();
    const at::Tensor draft = at::where(targets.ge(0), target_to_draft_.index_select(0, targets.clamp_min(0)),
                                       at::full_like(targets, -1));
    const at::Tensor keep = draft.ge(0).nonzero().flatten();
    const at::Tensor step = keep.div(rows * length, "floor");
    const at::Tensor keep_device = keep.to(device_);
    sdk::TensorDict result{{"hidden", model.final_norm(out.reshape({-1, h}).index_select(0, keep_device))},
                           {"targets", draft.index_select(0, keep).to(device_)},
                           {"row_weights", weights_.index_select(0, step).to(device_)},
                           {"slot", (step + 1).to(device_)}};
    const at::Tensor last = inputs.get("last_hidden");
    if (last.defined()) {
      const at::Tensor within = keep.remainder(rows * length);  // b·S + i
      const at::Tensor teacher_row = within - within.remainder(length) + layout.teacher_index.flatten().index_select(0, keep);
      result.set("teacher_hidden", last.reshape({rows * length, last.size(-1)}).index_select(0, teacher_row.to(last.device())));
    }
    return result;
  }

  nlohmann::json export_config() const {
    const Eagle3Shape& s = bound().shape();
    return {{"architectures", {"LlamaForCausalLMEagle3"}},
            {"model_type", "llama"},
            {"hidden_size", s.hidden},
            {"target_hidden_size", s.target_hidden},
            {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"intermediate_size", s.intermediate},
            {"num_hidden_layers", 1},
            {"rms_norm_eps", s.rms_norm_eps},
            {"rope_theta", s.rope_theta},
            {"vocab_size", target_vocab_},
            {"draft_vocab_size", s.draft_vocab},
            {"tie_word_embeddings", false},
            // The host's facts: the rows of step k are slot k + 1.
            {"block_size", steps_ + 1},
            {"target_layer_ids", layer_ids_},
            {"mask_token_id", nullptr},
            {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", layer_ids_}}},
            {"eagle3_config", {{"ttt_steps", steps_}, {"ttt_decay", decay_}}}};
  }
  nlohmann::json checkpoint_match() const {
    return {{"drafter", {"hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                         "draft_vocab_size"}},
            {"target", {{"vocab_size", "vocab_size"}, {"target_hidden_size", "hidden_size"}}}};
  }

 private:
  const Eagle3Model& bound() const {
    if (!model_) throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "eagle3: bind_target was not called");
    return *model_;
  }

  nlohmann::json config_;
  uint64_t seed_;
  c10::Device device_;
  c10::ScalarType dtype_;
  int64_t steps_;
  double decay_;
  int64_t target_vocab_ = 0;
  std::vector<int64_t> layer_ids_;
  DraftVocabulary vocabulary_;
  bool vocabulary_from_counts_ = false;
  std::unique_ptr<Eagle3Model> model_;
  at::Tensor embed_, teacher_head_, d2t_, t2d_, target_to_draft_, weights_;
};

}  // namespace
}  // namespace dflash::eagle3

DFLASH_PLUGINS(dflash::eagle3::Eagle3Drafter)
