// The `eagle3` drafter plugin (issue 43), written against the installed SDK
// as an outside team would write it: EAGLE-3 trained with its training-time
// test over a draft vocabulary (eagle3_model.h, ttt_layout.h,
// draft_vocabulary.h). The host knows nothing of it beyond the ABI: the
// loss scores its rows through its own head (ABI 1.6 loss_heads), the
// teacher through the target's head restricted to the draft vocabulary, and
// its draft vocabulary's maps are checkpoint buffers (ABI 1.6 buffers).
//
// Drafting for eval runs the same layer one sequence at a time (the ATen
// path). The planner's facts: memory_model.h. Not yet here: drafting
// kernels and graphs.
#include "draft_vocabulary.h"
#include "eagle3_model.h"
#include "memory_model.h"
#include "ttt_layout.h"

#include <dflash/sdk.hpp>
#include <dflash/sdk/recipe.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <fstream>
#include <map>
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

// The drafter's shape and target layers from its config and the target's
// facts: one resolution for bind_target and plan_memory. Throws sdk::Error
// naming the key.
struct Resolved {
  Eagle3Shape shape;
  std::vector<int64_t> layer_ids;
};
Resolved resolve(const nlohmann::json& config, const nlohmann::json& target) {
  const int64_t layers = target.at("num_layers").get<int64_t>();
  Resolved r;
  r.layer_ids = config.at("target_layer_ids").get<std::vector<int64_t>>();
  if (r.layer_ids.empty()) r.layer_ids = default_layer_ids(layers);
  if (static_cast<int64_t>(r.layer_ids.size()) != kFeatureLayers)
    throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "drafter.target_layer_ids: EAGLE-3 reads 3 target layers, got " +
                                                    std::to_string(r.layer_ids.size()));
  for (int64_t id : r.layer_ids)
    if (id >= layers)
      throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "drafter.target_layer_ids: layer " + std::to_string(id) +
                                                      " is out of range; the target has " + std::to_string(layers) + " layers");
  auto own_or_target = [&](const char* key, const char* fact) {
    const int64_t own = config.at(key).get<int64_t>();
    return own > 0 ? own : target.at(fact).get<int64_t>();
  };
  Eagle3Shape& s = r.shape;
  s.hidden = target.at("hidden_size").get<int64_t>();
  s.target_hidden = s.hidden;
  s.feature_layers = kFeatureLayers;
  s.heads = own_or_target("num_attention_heads", "num_attention_heads");
  s.kv_heads = own_or_target("num_key_value_heads", "num_key_value_heads");
  s.head_dim = own_or_target("head_dim", "head_dim");
  s.intermediate = own_or_target("intermediate_size", "intermediate_size");
  s.draft_vocab = config.at("draft_vocab_size").get<int64_t>();
  s.rms_norm_eps = target.value("rms_norm_eps", 1e-6);
  s.rope_theta = target.value("rope_theta", 10000.0);
  s.fused_ops = config.at("layer_ops").get<std::string>() == "fused";
  s.flash_attention = config.at("attention_kernel").get<std::string>() == "auto";
  return r;
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
        .string("layer_ops", "fused",
                "training's norms and MLP: fused = autograd functions that keep only their inputs and per-row "
                "statistics for backward (on the CUDA kernels shared with the hf_decoder target in bf16/fp16, closed "
                "forms elsewhere); aten = op by op through autograd (the reference; more memory)",
                {"fused", "aten"})
        .string("attention_kernel", "auto",
                "training's TTT attention: auto = flash attention (varlen, documents as sequences) where it runs "
                "(CUDA bf16/fp16, head_dim a multiple of 8 up to 256), the chunked ATen form elsewhere; chunked = the "
                "chunked form always (the reference)",
                {"auto", "chunked"})
        .dump();
  }

  explicit Eagle3Drafter(const sdk::CreateContext& c)
      : config_(c.config()),
        seed_(c.seed()),
        device_(sdk::parse_device(c.device())),
        dtype_(sdk::parse_dtype(c.dtype())),
        steps_(config_.at("ttt_steps").get<int64_t>()),
        decay_(config_.at("ttt_decay").get<double>()) {}

  // The memory planner's question (ABI 1.2), answered from the shapes
  // (memory_model.h): what it keeps beside its parameters (the vocabulary
  // maps), every TTT step's saved
  // tensors, the backward's peak; and the facts that size the loss over the
  // draft vocabulary with its own head.
  static sdk::MemoryPlan plan_memory(const sdk::PlanRequest& request) {
    const nlohmann::json& config = request.config();
    const nlohmann::json& context = request.context();
    if (!context.contains("target") || !context.contains("rows") || !context.contains("row_length"))
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "plan_memory: the context needs target, rows and row_length");
    const nlohmann::json& target = context.at("target");
    const Resolved resolved = resolve(config, target);
    const Eagle3Shape& s = resolved.shape;
    const int64_t vocab = target.at("vocab_size").get<int64_t>();
    check_draft_vocab_size(s.draft_vocab, vocab);
    Eagle3StepShape step;
    step.rows = context.at("rows").get<int64_t>();
    step.row_length = context.at("row_length").get<int64_t>();
    step.steps = config.at("ttt_steps").get<int64_t>();
    step.element_bytes = request.element_bytes();
    step.cuda = request.device().rfind("cuda", 0) == 0;
    step.teacher = context.value("teacher", false);
    sdk::MemoryPlan plan = step_memory(s, step);
    // The teacher's rows of the target head the host counts from
    // teacher_hidden below; the maps are the drafter's own.
    plan.add("the draft vocabulary's maps (t2d, d2t)", static_cast<double>(vocab + 8 * s.draft_vocab),
             sdk::MemoryPhase::kResident);
    const int64_t q_width = s.heads * s.head_dim;
    plan.facts = {{"parameters", parameter_count(s)},
                  {"largest_parameter", std::max({s.draft_vocab * s.hidden, s.intermediate * s.hidden, 2 * s.hidden * q_width,
                                                  s.hidden * s.feature_layers * s.target_hidden})},
                  {"target_layer_ids", resolved.layer_ids},
                  {"loss_rows", loss_rows(step)},
                  {"hidden_size", s.hidden},
                  {"loss_vocab", s.draft_vocab},
                  {"loss_weight_trainable", true},
                  {"teacher_hidden", s.target_hidden}};
    return plan;
  }

  void bind_target(const nlohmann::json& target, const sdk::TensorDict& frozen) {
    target_vocab_ = target.at("vocab_size").get<int64_t>();
    // Serving frameworks size the rotary tables from it (0: the target does not say).
    max_positions_ = target.value("max_position_embeddings", int64_t{0});
    const Resolved resolved = resolve(config_, target);
    const Eagle3Shape& s = resolved.shape;
    layer_ids_ = resolved.layer_ids;
    const std::string counts = config_.at("token_counts").get<std::string>();
    vocabulary_from_counts_ = !counts.empty();
    // Without counts (eval) the vocabulary is a placeholder until the
    // checkpoint's d2t is restored into the buffer; either way its size is
    // checked against the target's.
    const DraftVocabulary vocabulary = draft_vocabulary_from_counts(
        vocabulary_from_counts_ ? read_token_counts(counts, target_vocab_) : at::zeros({target_vocab_}, at::kLong), s.draft_vocab);
    const auto options = at::TensorOptions().dtype(dtype_).device(device_);
    model_ = std::make_unique<Eagle3Model>(s, options, seed_);
    embed_ = frozen.at("embed_tokens").to(options);
    teacher_head_ = frozen.at("lm_head").to(options).index_select(0, vocabulary.draft_to_target.to(device_));
    d2t_ = vocabulary.d2t().to(device_);
    t2d_ = vocabulary.t2d().to(device_);
    target_to_draft_ = vocabulary.target_to_draft;
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

  // Speculative drafting, one session per sequence. A session holds the
  // accepted tokens and, for each position whose next token is known, its
  // key and value (eagle3_model.h: the layer reads the token after a
  // position with the target's features at it). The newest accepted token's
  // features come with the next extension; draft_propose completes the
  // position before it with last_token and drafts from there, its drafts'
  // keys kept only for the proposal.
  int64_t draft_begin() {
    bound();
    sessions_[next_session_] = Session{};
    return next_session_++;
  }
  void draft_extend(int64_t id, const sdk::TensorDict& inputs) {
    const c10::NoGradGuard no_grad;
    Session& s = session(id);
    const at::Tensor ids = inputs.at("input_ids").to(at::kCPU, at::kLong).reshape({-1});
    const int64_t n = ids.size(0);
    if (n == 0) return;
    std::vector<at::Tensor> features;
    for (int64_t layer : layer_ids_) {
      const at::Tensor f = inputs.at("hidden." + std::to_string(layer));
      if (f.dim() != 2 || f.size(0) != n)
        throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_extend: hidden." + std::to_string(layer) + " must be [" +
                                                          std::to_string(n) + ", H] for the " + std::to_string(n) + " tokens");
      features.push_back(f.to(device_, dtype_));
    }
    // A position completed by draft_propose read last_token as its next one:
    // the extension must start with it.
    if (s.completed_with >= 0) {
      if (ids[0].item<int64_t>() != s.completed_with)
        throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_extend: the session's newest token was " +
                                                          std::to_string(s.completed_with) + " (draft_propose's last_token), but the "
                                                          "extension starts with " + std::to_string(ids[0].item<int64_t>()));
      s.completed_with = -1;
    }
    const std::vector<int64_t> fresh(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
    s.tokens.insert(s.tokens.end(), fresh.begin(), fresh.end());
    const at::Tensor projected = bound().project(at::cat(features, -1));
    s.pending = s.pending.defined() ? at::cat({s.pending, projected}) : projected;
    // Every pending position but the newest knows its next token now.
    commit(s, static_cast<int64_t>(s.tokens.size()) - 1 - s.committed);
  }
  at::Tensor draft_propose(int64_t id, const sdk::TensorDict& inputs, int64_t count) {
    const c10::NoGradGuard no_grad;
    Session& s = session(id);
    const int64_t last = inputs.at("last_token").to(at::kCPU, at::kLong).reshape({-1})[0].item<int64_t>();
    if (last < 0 || last >= target_vocab_)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_propose: last_token " + std::to_string(last) + " is outside the vocabulary");
    if (count <= 0 || s.tokens.empty()) return at::empty({0}, at::kLong);
    if (s.completed_with < 0) {  // the newest position, with last_token after it
      s.completed_with = last;
      commit(s, 1, last);
    } else if (s.completed_with != last) {
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_propose: last_token changed without an extension");
    }
    const Eagle3Model& model = bound();
    at::Tensor keys = s.keys, values = s.values, hidden = s.last_output;
    const at::Tensor d2t = d2t_.to(at::kCPU);
    std::vector<int64_t> drafted;
    int64_t position = static_cast<int64_t>(s.tokens.size()) - 1;  // the completed position's
    for (int64_t k = 0; k < count; ++k) {
      const int64_t draft_id = model.draft_logits(hidden).argmax(-1).to(at::kCPU)[0].item<int64_t>();
      drafted.push_back(draft_id + d2t[draft_id].item<int64_t>());
      if (k + 1 == count) break;
      ++position;
      const Eagle3Model::Pass ahead = model.extend(embed_.index_select(0, at::full({1}, drafted.back(), at::kLong).to(device_)),
                                                   hidden, at::full({1}, position, at::kLong).to(device_), keys, values);
      keys = at::cat({keys, ahead.keys}, 1);
      values = at::cat({values, ahead.values}, 1);
      hidden = ahead.out;
    }
    return at::tensor(drafted, at::kLong);
  }
  void draft_end(int64_t id) { sessions_.erase(id); }

  nlohmann::json export_config() const {
    const Eagle3Shape& s = bound().shape();
    nlohmann::json config = {{"architectures", {"LlamaForCausalLMEagle3"}},
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
            {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", layer_ids_}}},
            {"eagle3_config", {{"ttt_steps", steps_}, {"ttt_decay", decay_}}}};
    if (max_positions_ > 0) config["max_position_embeddings"] = max_positions_;  // absent where the target does not say
    return config;
  }
  nlohmann::json checkpoint_match() const {
    return {{"drafter", {"hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                         "draft_vocab_size"}},
            {"target", {{"vocab_size", "vocab_size"}, {"target_hidden_size", "hidden_size"}}}};
  }

 private:
  struct Session {
    std::vector<int64_t> tokens;    // accepted, in order
    int64_t committed = 0;          // positions whose key and value are cached
    at::Tensor pending;             // fc'd features of positions committed … tokens.size() − 1
    at::Tensor keys, values;        // [kv_heads, committed, d]
    at::Tensor last_output;         // the newest committed position's output [1, H]
    int64_t completed_with = -1;    // last_token, once draft_propose completed the newest position
  };
  Session& session(int64_t id) {
    auto found = sessions_.find(id);
    if (found == sessions_.end()) throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "eagle3: no drafting session " + std::to_string(id));
    return found->second;
  }
  // Caches the next n pending positions; the token after the newest of them
  // is `next_token` when given (draft_propose), else the session's own.
  void commit(Session& s, int64_t n, int64_t next_token = -1) {
    if (n <= 0) return;
    std::vector<int64_t> next(s.tokens.begin() + s.committed + 1, s.tokens.begin() + std::min<int64_t>(s.committed + n + 1, s.tokens.size()));
    if (next_token >= 0) next.push_back(next_token);
    const at::Tensor embeddings = embed_.index_select(0, at::tensor(next, at::kLong).to(device_));
    const Eagle3Model::Pass pass = bound().extend(embeddings, s.pending.narrow(0, 0, n),
                                                  at::arange(s.committed, s.committed + n, at::kLong).to(device_), s.keys, s.values);
    s.keys = s.keys.defined() ? at::cat({s.keys, pass.keys}, 1) : pass.keys;
    s.values = s.values.defined() ? at::cat({s.values, pass.values}, 1) : pass.values;
    s.last_output = pass.out.narrow(0, n - 1, 1);
    s.pending = s.pending.narrow(0, n, s.pending.size(0) - n);
    s.committed += n;
  }

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
  int64_t max_positions_ = 0;
  std::vector<int64_t> layer_ids_;
  bool vocabulary_from_counts_ = false;
  std::unique_ptr<Eagle3Model> model_;
  at::Tensor embed_, teacher_head_, d2t_, t2d_, target_to_draft_, weights_;
  std::map<int64_t, Session> sessions_;
  int64_t next_session_ = 0;
};

}  // namespace
}  // namespace dflash::eagle3

DFLASH_PLUGINS(dflash::eagle3::Eagle3Drafter)
