// target/hf_hybrid: a frozen Qwen3.5 / Qwen3.6 hybrid target (Gated DeltaNet
// + gated attention; dense or Mixture-of-Experts MLP) loaded from a Hugging
// Face folder — the text model's own or the multimodal checkpoint the models
// ship as. Its forward returns the hidden states the drafter reads; decoding
// keeps per session the full-attention layers' KV caches and the linear
// layers' conv windows and recurrent states.
//
// "hidden.<i>" is the output of decoder layer i (0-based, counting every
// layer, linear and full alike) — Hugging Face's hidden_states[i + 1].
#include "hybrid_memory.h"
#include "hybrid_model.h"

#include <pending_trees.h>
#include <plugin_errors.h>
#include <target_outputs.h>
#include <tokenizer_fact.h>

#include <dflash/sdk/recipe.hpp>
#include <dflash/sdk/target_model.hpp>

#include <memory>

namespace {
using namespace dflash;

using hf::invalid_argument_as_error;
using hf::load_errors_as_not_found;

const char* mixer_name(target::Mixer m) {
  return m == target::Mixer::kLinearAttention ? "linear_attention" : "full_attention";
}

class HfHybridTarget : public sdk::TargetModel {
 public:
  static constexpr sdk::PluginInfo info{
      "hf_hybrid", "1.0.0",
      "Qwen3.5 / Qwen3.6 hybrid (Gated DeltaNet + gated attention, dense or MoE) from a Hugging Face directory (frozen)"};
  static std::string config_schema() {
    using sdk::Bounds;
    return sdk::Schema()
        .required_string("path", "the Hugging Face model directory (config.json + model.safetensors or shards); a "
                                 "multimodal Qwen3.5 / Qwen3.6 folder's text model is read, its vision tower ignored")
        .string("dtype", "auto", "weights and activations: auto = the host's compute dtype",
                {"auto", "float32", "bfloat16", "float16"})
        .integer("feature_layers", 5,
                 "how many layers default_layer_ids lists (the drafter's layer count), by the recipe's rule "
                 "(sdk::default_target_layer_ids over all the model's layers, linear and full alike)",
                 Bounds::between(1, 1024))
        .string("exact_decoding", "auto", decode_support::exact_decoding_help(), {"auto", "on", "off"})
        .string("decode_graphs", "auto",
                "a single sequence's decoding steps on the GPU where exact decoding applies (a token, a verified "
                "block): auto = capture each step shape (tokens, layers returned, logits) as a CUDA graph on its "
                "second use and replay it after; the KV cache pool then stays allocated between sequences (graphs "
                "read its addresses) until the plugin is destroyed; off = every step runs eagerly",
                {"auto", "off"})
        .dump();
  }

  explicit HfHybridTarget(const sdk::CreateContext& context) : host_(context.host()) {
    const nlohmann::json& config = context.config();
    const std::string dtype = config.at("dtype").get<std::string>();
    path_ = config.at("path").get<std::string>();
    model_ = load_errors_as_not_found([&] {
      target::HybridOptions options;
      options.exact_decoding = decode_support::parse_exact_decoding(config.value("exact_decoding", std::string("auto")));
      options.decode_graphs = config.value("decode_graphs", std::string("auto")) == "auto";
      return std::make_unique<target::HybridModel>(path_, sdk::parse_dtype(dtype == "auto" ? context.dtype() : dtype),
                                                   sdk::parse_device(context.device()), options);
    });
    if (model_->ignored_tensors() > 0)
      host_->log(DFLASH_LOG_INFO, info.name,
                 (path_ + ": read the text model (" + model_->text_prefix() + "*); " +
                  std::to_string(model_->ignored_tensors()) +
                  " tensors of the vision tower and multi-token-prediction head are not used")
                     .c_str());
    feature_layers_ = config.at("feature_layers").get<int64_t>();
    tokenizer_ = hf::tokenizer_fact(path_);
  }

  // The memory planner's question (ABI 1.2): weights, one forward's working
  // memory, and what decoding keeps per session, from config.json and the
  // safetensors headers.
  static sdk::MemoryPlan plan_memory(const sdk::PlanRequest& request) {
    const nlohmann::json& config = request.config();
    const std::string dtype = config.at("dtype").get<std::string>();
    const std::string weights_dtype = dtype == "auto" ? request.dtype() : dtype;
    const std::string path = config.at("path").get<std::string>();
    const target::HybridMemory m = load_errors_as_not_found([&] {
      return target::plan_hybrid_memory(path, sdk::parse_dtype(weights_dtype), request.context().value("rows", int64_t{1}),
                                        request.context().value("row_length", int64_t{1}),
                                        request.device().rfind("cuda", 0) == 0);
    });
    const target::HybridConfig& c = m.config;
    sdk::MemoryPlan plan;
    plan.add("target weights (" + std::to_string(c.num_layers) + " layers: " +
                 std::to_string(c.count(target::Mixer::kLinearAttention)) + " linear, " +
                 std::to_string(c.count(target::Mixer::kFullAttention)) + " full attention" +
                 (c.is_moe() ? ", " + std::to_string(c.moe.experts) + " experts" : std::string()) + "; " + weights_dtype +
                 ")",
             static_cast<double>(m.weight_bytes), sdk::MemoryPhase::kResident);
    plan.add("target forward working memory", static_cast<double>(m.forward_bytes), sdk::MemoryPhase::kTargetForward);
    plan.facts = describe_config(c, config.at("feature_layers").get<int64_t>());
    plan.facts["weights_dtype"] = weights_dtype;
    plan.facts["tied_embeddings"] = c.tie_word_embeddings;
    plan.facts["decode_state_bytes_per_session"] = m.state_bytes_per_session;
    plan.facts["decode_kv_bytes_per_token"] = m.kv_bytes_per_token;
    plan.facts["tokenizer"] = hf::tokenizer_fact(path);
    return plan;
  }

  // What config.json alone gives. The drafter's defaults read num_attention_heads,
  // num_key_value_heads, head_dim, rope_theta and rms_norm_eps (the full
  // attention layers'), and intermediate_size (a dense model's MLP width; an
  // MoE model's expert width).
  static nlohmann::json describe_config(const target::HybridConfig& c, int64_t feature_layers) {
    nlohmann::json types = nlohmann::json::array();
    for (target::Mixer m : c.layer_types) types.push_back(mixer_name(m));
    nlohmann::json d = {{"num_layers", c.num_layers},
                        {"hidden_size", c.hidden_size},
                        {"vocab_size", c.vocab_size},
                        {"num_attention_heads", c.num_heads},
                        {"num_key_value_heads", c.num_kv_heads},
                        {"head_dim", c.head_dim},
                        {"rotary_dim", c.rotary_dim},
                        {"intermediate_size", c.is_moe() ? c.moe.intermediate : c.intermediate_size},
                        {"rms_norm_eps", c.rms_norm_eps},
                        {"rope_theta", c.rope_theta},
                        {"model_type", c.model_type},
                        {"layer_types", types},
                        {"linear_attention",
                         {{"key_heads", c.linear_key_heads},
                          {"value_heads", c.linear_value_heads},
                          {"key_head_dim", c.linear_key_dim},
                          {"value_head_dim", c.linear_value_dim},
                          {"conv_kernel", c.conv_kernel}}},
                        {"default_layer_ids", sdk::default_target_layer_ids(c.num_layers, feature_layers)},
                        {"eos_token_ids", c.generation.eos_token_ids},
                        {"bos_token_id", c.generation.bos_token_id},
                        {"max_position_embeddings", c.generation.max_position_embeddings}};
    if (c.is_moe())
      d["experts"] = {{"num_experts", c.moe.experts},
                      {"num_experts_per_tok", c.moe.top_k},
                      {"moe_intermediate_size", c.moe.intermediate},
                      {"shared_expert_intermediate_size", c.moe.shared_intermediate},
                      {"norm_topk_prob", c.moe.normalize}};
    return d;
  }

  nlohmann::json describe() const {
    nlohmann::json d = describe_config(model_->config(), feature_layers_);
    d["tokenizer"] = tokenizer_;
    d["text_prefix"] = model_->text_prefix();
    d["exact_decoding"] = model_->uses_exact_decoding();
    d["decode_graphs"] = model_->uses_decode_graphs();
    const decode_support::GraphStats& graphs = model_->decode_graph_stats();
    d["decode_graph_stats"] = {{"captured", graphs.captured}, {"replayed", graphs.replayed}, {"failed", graphs.failed},
                               {"last_error", graphs.last_error}};
    return d;
  }

  sdk::TensorDict forward(const sdk::TargetRequest& request) {
    const target::HybridOutputs out = invalid_argument_as_error([&] {
      return model_->forward(request.batch.at("input_ids"), request.batch.get("position_ids"),
                             request.batch.get("document_ids"), request.layer_ids, request.want_last_hidden,
                             request.want_logits);
    });
    return hf::target_outputs(out, request.layer_ids, request.want_last_hidden, request.want_logits);
  }

  sdk::TensorDict frozen_weights() {
    return {{"embed_tokens", model_->embed_tokens()}, {"lm_head", model_->lm_head()}, {"final_norm", model_->final_norm()}};
  }

  int64_t decode_begin(int64_t max_length) {
    const int64_t limit = model_->config().generation.max_position_embeddings;
    if (limit > 0 && max_length > limit)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "decode_begin: max_length " + std::to_string(max_length) +
                                                        " exceeds the model's max_position_embeddings " +
                                                        std::to_string(limit) + " (" + path_ + "/config.json)");
    return invalid_argument_as_error([&] { return model_->begin(max_length); });
  }
  sdk::TensorDict decode_extend(int64_t session, const sdk::DecodeRequest& request) {
    const target::HybridOutputs out = invalid_argument_as_error([&] {
      trees_.require_none(session, "decode_extend");
      return model_->extend({session}, request.tokens.reshape({1, -1}), request.layer_ids,
                            request.want_logits ? target::HybridLogits::kAll : target::HybridLogits::kNone);
    });
    return hf::target_outputs(out, request.layer_ids, false, request.want_logits, /*single_row=*/true);
  }
  sdk::TensorDict decode_extend_batch(const sdk::BatchDecodeRequest& request) {
    const target::HybridLogits rows = request.logits == sdk::DecodeLogits::kAll    ? target::HybridLogits::kAll
                                      : request.logits == sdk::DecodeLogits::kLast ? target::HybridLogits::kLast
                                                                                   : target::HybridLogits::kNone;
    const target::HybridOutputs out = invalid_argument_as_error([&] {
      for (int64_t session : request.sessions) trees_.require_none(session, "decode_extend_batch");
      return model_->extend(request.sessions, request.tokens, request.layer_ids, rows);
    });
    return hf::target_outputs(out, request.layer_ids, false, rows != target::HybridLogits::kNone);
  }
  void decode_truncate(int64_t session, int64_t length) {
    invalid_argument_as_error([&] {
      trees_.require_none(session, "decode_truncate");
      model_->truncate(session, length);
    });
  }
  // A tree of drafts (ABI 1.4): verified in one pass, then cut back to the
  // accepted path (hybrid_model.h; pending_trees.h keeps the rules).
  sdk::TensorDict decode_verify_tree(int64_t session, const sdk::TreeDecodeRequest& request) {
    const target::HybridOutputs out = invalid_argument_as_error([&] {
      trees_.require_none(session, "decode_verify_tree");
      const int64_t length = model_->length(session);
      target::HybridOutputs result = model_->verify_tree(session, request.tokens, request.parents, request.layer_ids, request.want_logits);
      trees_.add(session, {length, request.parents});
      return result;
    });
    return hf::target_outputs(out, request.layer_ids, false, request.want_logits, /*single_row=*/true);
  }
  void decode_accept_path(int64_t session, const std::vector<int64_t>& path) {
    invalid_argument_as_error([&] {
      const decode_support::PendingTrees::Tree& tree = trees_.check_path(session, path);
      model_->accept_path(session, tree.length, path);
      trees_.take(session);
    });
  }
  void decode_end(int64_t session) {
    trees_.take(session);
    model_->end(session);
  }

 private:
  const dflash_host_api* host_;
  std::string path_;
  std::unique_ptr<target::HybridModel> model_;
  decode_support::PendingTrees trees_;  // verified draft trees awaiting decode_accept_path
  int64_t feature_layers_ = 5;
  nlohmann::json tokenizer_;
};

}  // namespace

DFLASH_PLUGINS(HfHybridTarget)
