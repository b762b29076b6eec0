// target/hf_decoder: a frozen Llama-family target (Llama, Mistral, Qwen2,
// Qwen3, and Qwen3 MoE such as Qwen3-30B-A3B) loaded from a Hugging Face model
// directory. Its forward returns the hidden states the drafter reads; its
// embedding, final norm and lm_head are handed to the host, which places a
// copy on each drafter device.
//
// "hidden.<i>" is the output of decoder layer i (0-based) — Hugging Face's
// hidden_states[i + 1].
#include "decoder.h"

#include <pending_trees.h>
#include <plugin_errors.h>
#include <target_outputs.h>
#include <tokenizer_fact.h>

#include <dflash/sdk/recipe.hpp>
#include <dflash/sdk/target_model.hpp>

#include <map>
#include <memory>

namespace {
using namespace dflash;

using hf::invalid_argument_as_error;
using hf::load_errors_as_not_found;

class HfDecoderTarget : public sdk::TargetModel {
 public:
  static constexpr sdk::PluginInfo info{"hf_decoder", "1.0.0",
                                        "Llama / Mistral / Qwen2 / Qwen3 / Qwen3 MoE decoder from a Hugging Face directory (frozen)"};
  static std::string config_schema() {
    using sdk::Bounds;
    return sdk::Schema()
        .required_string("path", "the Hugging Face model directory (config.json + model.safetensors or shards)")
        .string("dtype", "auto", "weights and activations: auto = the host's compute dtype",
                {"auto", "float32", "bfloat16", "float16"})
        .integer("feature_layers", 5,
                 "how many layers default_layer_ids lists (the drafter's layer count), by the recipe's rule "
                 "(sdk::default_target_layer_ids: evenly from 1 to L − 3, as the reference DFlash code)",
                 Bounds::between(1, 1024))
        .string("kernels", "auto",
                "auto = our CUDA kernels and flash attention on a CUDA device in bf16/fp16 (the ATen path "
                "elsewhere); aten = the ATen reference path everywhere",
                {"auto", "aten"})
        .integer("streams", 2,
                 "GPU path: the batch's rows run as this many micro-batches on as many CUDA streams, so one's "
                 "memory-bound kernels and attention overlap another's GEMMs (1 = no overlap)",
                 Bounds::between(1, 8))
        .string("attention", "auto",
                "GPU path, rows that are each one document: auto = cuDNN's fused attention where it works on this "
                "machine, else flash attention; flash = always flash attention (packed rows always use it)",
                {"auto", "flash"})
        .string("decode_graphs", "auto",
                "incremental decoding of one sequence on the GPU path: auto = capture each step shape (tokens per "
                "step, layers returned, logits) as a CUDA graph on its second use and replay it after (not with "
                "experts: a Qwen3 MoE step reads its routing back to the host); the KV cache pool then stays "
                "allocated between sequences (graphs read its addresses) until the plugin is destroyed; off = every "
                "step runs eagerly and the pool is freed with its last session",
                {"auto", "off"})
        .string("exact_decoding", "auto", decode_support::exact_decoding_help(), {"auto", "on", "off"})
        .dump();
  }

  explicit HfDecoderTarget(const sdk::CreateContext& context) : host_(context.host()) {
    const std::string dtype = context.config().at("dtype").get<std::string>();
    const auto scalar = sdk::parse_dtype(dtype == "auto" ? context.dtype() : dtype);
    decoder_ = load_errors_as_not_found([&] {
      return std::make_unique<target::Decoder>(context.config().at("path").get<std::string>(), scalar,
                                               sdk::parse_device(context.device()), options(context.config()));
    });
    sessions_ = decoder_->new_sessions();
    feature_layers_ = context.config().at("feature_layers").get<int64_t>();
    tokenizer_ = hf::tokenizer_fact(context.config().at("path").get<std::string>());
  }

  static target::DecoderOptions options(const nlohmann::json& config) {
    target::DecoderOptions o;
    o.cuda_kernels = config.value("kernels", std::string("auto")) == "auto";
    o.streams = config.value("streams", int64_t{2});
    o.cudnn_attention = config.value("attention", std::string("auto")) == "auto";
    o.decode_graphs = config.value("decode_graphs", std::string("auto")) == "auto";
    o.exact_decoding = decode_support::parse_exact_decoding(config.value("exact_decoding", std::string("auto")));
    return o;
  }

  // The memory planner's question (ABI 1.2): weights and one forward's
  // working memory, from config.json and the safetensors headers.
  static sdk::MemoryPlan plan_memory(const sdk::PlanRequest& request) {
    const nlohmann::json& config = request.config();
    const std::string dtype = config.at("dtype").get<std::string>();
    const std::string weights_dtype = dtype == "auto" ? request.dtype() : dtype;
    const std::string path = config.at("path").get<std::string>();
    const target::DecoderMemory m = load_errors_as_not_found([&] {
      return target::plan_decoder_memory(path, sdk::parse_dtype(weights_dtype), sdk::parse_device(request.device()),
                                         options(config), request.context().value("rows", int64_t{1}),
                                         request.context().value("row_length", int64_t{1}));
    });
    sdk::MemoryPlan plan;
    plan.add("target weights (" + std::to_string(m.config.num_layers) + " layers, " + weights_dtype + ")",
             static_cast<double>(m.weight_bytes), sdk::MemoryPhase::kResident);
    plan.add("target forward working memory", static_cast<double>(m.forward_bytes), sdk::MemoryPhase::kTargetForward);
    plan.facts = describe_config(m.config, config.at("feature_layers").get<int64_t>());
    plan.facts["cuda_kernels"] = m.cuda_kernels;
    plan.facts["forward_streams"] = m.side_streams;
    plan.facts["weights_dtype"] = weights_dtype;
    plan.facts["tied_embeddings"] = m.config.tie_word_embeddings;
    plan.facts["tokenizer"] = hf::tokenizer_fact(path);
    return plan;
  }

  // The description that config.json alone gives (describe() adds the rest).
  static nlohmann::json describe_config(const target::DecoderConfig& c, int64_t feature_layers) {
    nlohmann::json d = {{"num_layers", c.num_layers},
                       {"hidden_size", c.hidden_size},
                       {"vocab_size", c.vocab_size},
                       {"num_attention_heads", c.num_heads},
                       {"num_key_value_heads", c.num_kv_heads},
                       {"head_dim", c.head_dim},
                       {"intermediate_size", c.intermediate_size},
                       {"rms_norm_eps", c.rms_norm_eps},
                       {"rope_theta", c.rope_theta},
                       {"model_type", c.model_type},
                       {"default_layer_ids", sdk::default_target_layer_ids(c.num_layers, feature_layers)},
                       {"eos_token_ids", c.eos_token_ids},
                       {"bos_token_id", c.bos_token_id},
                       {"max_position_embeddings", c.max_position_embeddings}};
    if (c.has_experts()) {
      std::vector<int64_t> sparse;
      for (int64_t i = 0; i < c.num_layers; ++i)
        if (c.is_sparse(i)) sparse.push_back(i);
      d["num_experts"] = c.moe.experts;
      d["num_experts_per_tok"] = c.moe.top_k;
      d["moe_intermediate_size"] = c.moe.intermediate;
      d["norm_topk_prob"] = c.moe.normalize;
      d["sparse_layers"] = sparse;
    }
    return d;
  }

  // What plan_memory reports, plus what only a loaded model knows: which
  // forward path runs here, and its tokenizer.
  nlohmann::json describe() const {
    nlohmann::json d = describe_config(decoder_->config(), feature_layers_);
    d["cuda_kernels"] = decoder_->uses_cuda_kernels();
    d["cudnn_attention"] = decoder_->uses_cudnn_attention();
    d["flash_decoding"] = decoder_->uses_flash_decoding();
    d["decode_graphs"] = decoder_->uses_decode_graphs();
    d["exact_decoding"] = decoder_->uses_exact_decoding();
    const target::Decoder::GraphStats graphs = decoder_->decode_graph_stats();
    d["decode_graph_stats"] = {{"captured", graphs.captured},
                               {"replayed", graphs.replayed},
                               {"failed", graphs.failed},
                               {"last_error", graphs.last_error}};
    d["tokenizer"] = tokenizer_;
    return d;
  }

  // Incremental decoding: one KV cache per session, pooled across sessions
  // (decode_sessions.h) so that decode_extend_batch runs them in one pass.
  int64_t decode_begin(int64_t max_length) {
    const int64_t limit = decoder_->config().max_position_embeddings;
    if (limit > 0 && max_length > limit)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "decode_begin: max_length " + std::to_string(max_length) +
                                                        " exceeds the model's max_position_embeddings " + std::to_string(limit) +
                                                        " (config.json)");
    return invalid_argument_as_error([&] { return sessions_.begin(max_length); });
  }
  sdk::TensorDict decode_extend(int64_t session, const sdk::DecodeRequest& request) {
    const target::DecoderOutputs out = invalid_argument_as_error([&] {
      trees_.require_none(session, "decode_extend");
      return decoder_->extend(sessions_, {session}, request.tokens.reshape({1, -1}), request.layer_ids,
                              request.want_logits ? target::LogitRows::kAll : target::LogitRows::kNone);
    });
    report_graph_failures();
    return hf::target_outputs(out, request.layer_ids, false, request.want_logits, /*single_row=*/true);
  }
  // One pass for many sessions (ABI 1.3): every projection is one GEMM over
  // all their tokens.
  sdk::TensorDict decode_extend_batch(const sdk::BatchDecodeRequest& request) {
    const target::LogitRows rows = request.logits == sdk::DecodeLogits::kAll    ? target::LogitRows::kAll
                                   : request.logits == sdk::DecodeLogits::kLast ? target::LogitRows::kLast
                                                                                : target::LogitRows::kNone;
    const target::DecoderOutputs out = invalid_argument_as_error([&] {
      for (int64_t session : request.sessions) trees_.require_none(session, "decode_extend_batch");
      return decoder_->extend(sessions_, request.sessions, request.tokens, request.layer_ids, rows);
    });
    report_graph_failures();
    return hf::target_outputs(out, request.layer_ids, false, rows != target::LogitRows::kNone);
  }
  // A tree of drafts (ABI 1.4): verified in one pass, then cut back to the
  // accepted path (decoder.h; pending_trees.h keeps the rules).
  sdk::TensorDict decode_verify_tree(int64_t session, const sdk::TreeDecodeRequest& request) {
    const target::DecoderOutputs out = invalid_argument_as_error([&] {
      trees_.require_none(session, "decode_verify_tree");
      const int64_t length = sessions_.at(session).length;
      target::DecoderOutputs result =
          decoder_->verify_tree(sessions_, session, request.tokens, request.parents, request.layer_ids, request.want_logits);
      trees_.add(session, {length, request.parents});
      return result;
    });
    return hf::target_outputs(out, request.layer_ids, false, request.want_logits, /*single_row=*/true);
  }
  void decode_accept_path(int64_t session, const std::vector<int64_t>& path) {
    invalid_argument_as_error([&] {
      const decode_support::PendingTrees::Tree& tree = trees_.check_path(session, path);
      decoder_->accept_path(sessions_, session, tree.length, path);
      trees_.take(session);
      return 0;
    });
  }
  void decode_truncate(int64_t session, int64_t length) {
    invalid_argument_as_error([&] {
      trees_.require_none(session, "decode_truncate");
      return 0;
    });
    target::DecodeSessions::Session& s = invalid_argument_as_error([&]() -> auto& { return sessions_.at(session); });
    if (length < 0 || length > s.length)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "decode_truncate: length " + std::to_string(length) +
                                                        " is outside [0, " + std::to_string(s.length) + "]");
    s.length = length;
  }
  void decode_end(int64_t session) {
    trees_.take(session);
    sessions_.end(session);
  }

  sdk::TensorDict forward(const sdk::TargetRequest& request) {
    const target::DecoderOutputs out = invalid_argument_as_error([&] {
      return decoder_->forward(request.batch.at("input_ids"), request.batch.get("position_ids"),
                               request.batch.get("document_ids"), request.layer_ids, request.want_last_hidden,
                               request.want_logits);
    });
    return hf::target_outputs(out, request.layer_ids, request.want_last_hidden, request.want_logits);
  }

  sdk::TensorDict frozen_weights() {
    return {{"embed_tokens", decoder_->embed_tokens()},
            {"lm_head", decoder_->lm_head()},
            {"final_norm", decoder_->final_norm()}};
  }

 private:
  // A step shape whose CUDA graph could not be captured runs eagerly from
  // then on; say so once per failure, with the reason.
  void report_graph_failures() {
    const auto& stats = decoder_->decode_graph_stats();
    if (stats.failed <= graph_failures_reported_) return;
    graph_failures_reported_ = stats.failed;
    host_->log(DFLASH_LOG_WARN, info.name,
               ("decoding step not captured as a CUDA graph (it runs eagerly): " + stats.last_error).c_str());
  }

  const dflash_host_api* host_;
  int64_t graph_failures_reported_ = 0;
  std::unique_ptr<target::Decoder> decoder_;
  int64_t feature_layers_ = 5;
  nlohmann::json tokenizer_;  // hf::tokenizer_fact: null unless the folder has a tokenizer
  target::DecodeSessions sessions_;
  decode_support::PendingTrees trees_;  // verified draft trees awaiting decode_accept_path
};

}  // namespace

DFLASH_PLUGINS(HfDecoderTarget)
