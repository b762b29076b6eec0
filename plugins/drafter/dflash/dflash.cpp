// drafter/dflash: the DFlash block drafter (see docs/drafter.md). Per batch
// row it samples anchors where the token and the next are supervised, lays
// out a block of block_size slots after each (slot 0 = the anchor token, the
// rest = MASK), and predicts token anchor + k at slot k from the blocks and
// the target's hidden states of target_layer_ids. The target's embedding and
// lm_head are reused frozen; its final norm seeds the drafter's own.
#include "block_layout.h"
#include "dflash_model.h"
#include "export_format.h"
#include "memory_model.h"

#include <cuda_graph.h>
#include <host_upload.h>
#include <dflash/sdk/drafter.hpp>
#include <dflash/sdk/torch_compat.hpp>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace {
using namespace dflash;

// The schema's default, also where a config handed straight to the plugin
// (tests, tools) leaves the key out.
constexpr const char* kDefaultAttentionKeeps = "auto";

class DFlashDrafter : public sdk::Drafter {
 public:
  static constexpr sdk::PluginInfo info{"dflash", "1.0.0", "DFlash block drafter: KV-injected target features, block slots"};

  static std::string config_schema() {
    using sdk::Bounds;
    return sdk::Schema()
        .integer("num_layers", 5, "drafter decoder layers", Bounds::between(1, 64))
        .integer("num_attention_heads", 0, "0 = the target's", Bounds::between(0, 1 << 14))
        .integer("num_key_value_heads", 0, "0 = the target's", Bounds::between(0, 1 << 14))
        .integer("head_dim", 0, "0 = the target's", Bounds::between(0, 1 << 14))
        .integer("intermediate_size", 0, "MLP width; 0 = the target's", Bounds::between(0, 1 << 22))
        .integer("block_size", 16, "slots per block: the anchor + block_size − 1 predicted tokens", Bounds::between(2, 256))
        .integer("max_anchors", 512, "blocks per batch row at most", Bounds::between(1, 1 << 20))
        .memory_knob("anchor count")
        .number("gamma", 0.0, "slot weight exp(−(k − 1)/γ); 0 = the recipe's: 7 for block_size ≥ 16, 4 for ≥ 8, else 2",
                Bounds::between(0, 1e6))
        .integer("mask_token_id", -1, "token fed to slots 1…; −1 = the last id of the target's vocabulary",
                 Bounds::between(-1, (int64_t{1} << 31) - 1))
        .integer_array("target_layer_ids", {},
                       "target layers fed to fc; empty = num_layers ids spaced from 1 to L − 3 as the reference "
                       "DFlash code spaces them (one layer: L / 2)",
                       Bounds::at_least(0))
        .number("init_std", 0.02, "standard deviation of the initial weights", Bounds::above(0).up_to(10))
        .number("rope_theta", 0.0, "0 = the target's (1e6 when the target does not say)", Bounds::between(0, 1e12))
        .string("attention", "blocks",
                "blocks: no mask at all — each group's shared context prefix through cuDNN's attention, and each "
                "block's remaining context and its own slots through our block kernel, merged by log-sum-exp (CUDA "
                "bf16, head_dim 128, 4 query heads per KV head, block_size " + cuda_kernels::block_sizes_in_words() +
                    "; grouped elsewhere, and an ATen "
                "reference of the same composition on the CPU; docs/drafter.md); grouped: one attention call per "
                "group of attention_group_blocks blocks, over the context up to the group's last anchor and the "
                "group's own slots (few masked pairs computed, under a mask); dense: one call per batch over every "
                "key with the whole mask (the reference)",
                {"grouped", "blocks", "dense"})
        .integer("attention_group_blocks", 64,
                 "blocks per grouped attention call: fewer compute fewer masked pairs, more give each call more work",
                 Bounds::between(1, 1 << 20))
        .integer("attention_group_key_multiple", 128,
                 "grouped: each group's context range is widened to a multiple of this many keys (the extra keys are "
                 "masked) so the attention calls come in few shapes: groups of one shape share a call, and fused "
                 "kernels (cuDNN's) plan each new shape once, which with exact ranges happens nearly every step",
                 Bounds::between(1, 1 << 20))
        .string("attention_kernel", "auto",
                "auto: cuDNN's fused attention on CUDA in bf16/fp16 where it runs and matches SDPA (checked once), "
                "SDPA elsewhere; sdpa: always SDPA",
                {"auto", "sdpa"})
        .string("layer_ops", "fused",
                "training's norms, q/k norm + RoPE and MLP: fused = autograd functions that keep only their inputs and "
                "statistics for backward (recomputing the normalised tensors and silu(gate)·up there), on the CUDA "
                "kernels shared with the hf_decoder target in bf16/fp16 and as closed forms elsewhere; aten = Hugging "
                "Face's op-by-op arithmetic through autograd (the reference; more memory)",
                {"fused", "aten"})
        .string("attention_keeps", kDefaultAttentionKeeps,
                "what grouped attention keeps for backward: rows = the layer's q, k and v rows only, each call's "
                "gathered again in backward (cuDNN's backward called directly where it runs and passes a check on "
                "first use: as fast as calls, less memory; elsewhere the call runs again under autograd); calls = "
                "every call's gathered q, k and v (the context's keys and values once per group, through "
                "autograd); auto = rows where cuDNN's attention runs, calls elsewhere",
                {"auto", "rows", "calls"})
        .boolean("embedding_on_cpu", false,
                 "keep the frozen embedding in host memory and send only the block slots' rows to the device each "
                 "step (saves vocab × hidden elements of device memory)")
        .boolean("activation_checkpointing", false,
                 "keep only each layer's input for backward and recompute the layer there (less memory, one more "
                 "forward of the layers)")
        .string("decode_graphs", "auto",
                "speculative drafting on a CUDA device in bf16/fp16: auto = hold a context extension of up to "
                "block_size tokens and run it with the next proposal (one block + lm_head + argmax) as one CUDA graph, "
                "captured on its second use and replayed after (the first proposal, after the prompt, has its own), "
                "while one drafting session is open; the context buffers then serve the next session; off = every call "
                "runs eagerly",
                {"auto", "off"})
        .string("kernels", "auto",
                "speculative drafting: auto = our fused CUDA kernels (those of the hf_decoder target: RMSNorm, q/k "
                "norm + RoPE, SwiGLU, with fused q/k/v and gate/up GEMMs) where flash drafting runs (CUDA, "
                "bf16/fp16), the ATen path elsewhere; aten = the ATen reference path everywhere. Training never "
                "uses them",
                {"auto", "aten"})
        .dump();
  }

  explicit DFlashDrafter(const sdk::CreateContext& context)
      : host_(context.host()), config_(context.config()), seed_(context.seed()), dtype_(sdk::parse_dtype(context.dtype())),
        device_(sdk::parse_device(context.device())) {
    block_size_ = config_.at("block_size").get<int64_t>();
    max_anchors_ = config_.at("max_anchors").get<int64_t>();
    gamma_ = config_.at("gamma").get<double>();
    if (gamma_ == 0) gamma_ = block_size_ >= 16 ? 7.0 : block_size_ >= 8 ? 4.0 : 2.0;
  }

  ~DFlashDrafter() {
    if (graph_stats_.captured + graph_stats_.failed == 0) return;
    host_->log(DFLASH_LOG_INFO, info.name,
               ("drafting CUDA graphs: " + std::to_string(graph_stats_.captured) + " captured, " +
                std::to_string(graph_stats_.replayed) + " replays, " + std::to_string(graph_stats_.failed) + " failed")
                   .c_str());
  }

  void bind_target(const nlohmann::json& target, const sdk::TensorDict& frozen) {
    const drafter::ResolvedShape resolved = drafter::resolve_shape(config_, target);
    const drafter::DrafterShape& shape = resolved.shape;
    vocab_ = resolved.vocab;
    layer_ids_ = resolved.layer_ids;
    mask_token_ = resolved.mask_token;
    target_layers_ = resolved.target_layers;
    max_position_embeddings_ = target.value("max_position_embeddings", int64_t{0});
    lm_head_ = frozen.at("lm_head");  // drafting turns the slots' hidden states into tokens
    embed_ = frozen.at("embed_tokens");
    if (config_.value("embedding_on_cpu", false)) embed_ = embed_.to(at::kCPU);  // the device copy is the host's to drop
    if (embed_.size(1) != shape.hidden)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "the target's embed_tokens is not [vocab, hidden_size]");
    model_ = std::make_unique<drafter::DFlashModel>(shape, seed_, config_.at("init_std").get<double>(), dtype_, device_);
    model_->init_final_norm(frozen.at("final_norm"));
    model_->set_activation_checkpointing(config_.value("activation_checkpointing", false));
    model_->set_attention_kernel(config_.value("attention_kernel", std::string("auto")) == "sdpa"
                                     ? drafter::DFlashModel::AttentionKernel::kSdpa
                                     : drafter::DFlashModel::AttentionKernel::kAuto);
    model_->set_layer_ops(config_.value("layer_ops", std::string("fused")) == "aten" ? drafter::DFlashModel::LayerOps::kAten
                                                                                : drafter::DFlashModel::LayerOps::kFused);
    model_->set_attention_keeps(
        drafter::attention_keeps_named(config_.value("attention_keeps", std::string(kDefaultAttentionKeeps))));
    group_blocks_ = group_blocks_of(config_);
    group_key_multiple_ = config_.at("attention_group_key_multiple").get<int64_t>();
    block_kernel_ = config_.at("attention").get<std::string>() == "blocks";
    weights_ = drafter::slot_weights(block_size_, gamma_);
    draft_lm_head_ = lm_head_.to(device_, dtype_);  // the slots' hidden states are in the drafter's dtype
    graphs_possible_ = decode_support::kCudaGraphs && config_.value("decode_graphs", std::string("auto")) == "auto" &&
                       model_->flash_drafting() && embed_.device() == device_;
    graph_pool_ = std::make_unique<decode_support::CudaGraphPool>(device_);
    model_->set_drafting_kernels(config_.value("kernels", std::string("auto")) == "auto");
  }

  // The embeddings of a batch's block slots [B, Q] on the drafter's device.
  // From host memory (embedding_on_cpu) only the distinct rows travel — the
  // anchors' tokens and the mask token, a few hundred of Q's thousands — and
  // the device expands them; otherwise one gather on the device.
  at::Tensor slot_embeddings_of(const at::Tensor& slot_ids) const {
    const at::Tensor ids = slot_ids.flatten();
    if (embed_.device() == device_) return embed_.index_select(0, decode_support::on_device(ids, device_));
    const auto [distinct, where] = at::_unique(ids.to(at::kCPU), /*sorted=*/false, /*return_inverse=*/true);
    return decode_support::on_device(embed_.index_select(0, distinct), device_)
        .index_select(0, decode_support::on_device(where, device_));
  }

  // Blocks per attention call (or per prefix call): attention_group_blocks
  // when grouped or blocks, 0 = dense.
  static int64_t group_blocks_of(const nlohmann::json& config) {
    return config.at("attention").get<std::string>() == "dense" ? 0 : config.at("attention_group_blocks").get<int64_t>();
  }

  // The memory planner's question (ABI 1.2), answered from the shapes: the
  // most blocks a batch can hold, every layer's saved activations, the
  // backward's peak (memory_model.h).
  static sdk::MemoryPlan plan_memory(const sdk::PlanRequest& request) {
    const nlohmann::json& config = request.config();
    const nlohmann::json& context = request.context();
    if (!context.contains("target") || !context.contains("rows") || !context.contains("row_length"))
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "plan_memory: the context needs target, rows and row_length");
    const drafter::ResolvedShape resolved = drafter::resolve_shape(config, context.at("target"));
    const drafter::DrafterShape& shape = resolved.shape;
    drafter::StepShape step;
    step.rows = context.at("rows").get<int64_t>();
    step.row_length = context.at("row_length").get<int64_t>();
    // Anchors need a supervised token after them: at most row_length − 1 per row.
    step.anchors = std::min(config.at("max_anchors").get<int64_t>(), std::max<int64_t>(1, step.row_length - 1));
    step.block_size = config.at("block_size").get<int64_t>();
    step.group_blocks = group_blocks_of(config);
    step.element_bytes = request.element_bytes();
    step.cuda = request.device().rfind("cuda", 0) == 0;
    step.cudnn = step.cuda && DFLASH_TORCH_AT_LEAST(2, 5) && config.at("attention_kernel").get<std::string>() == "auto" &&
                 (request.dtype() == "bfloat16" || request.dtype() == "float16");
    step.checkpointing = config.at("activation_checkpointing").get<bool>();
    step.fused = config.value("layer_ops", std::string("fused")) == "fused";
    // attention: blocks on the GPU keeps the rows too (and the merged output), with no masks.
    const bool block_layout = config.at("attention").get<std::string>() == "blocks" &&
                              drafter::takes_block_layout(step.group_blocks, step.block_size, shape.heads, shape.kv_heads);
    // The GPU runs it by the block kernel where the kernel takes the shape
    // (bf16, its head shape); a step of another shape falls back to grouped
    // attention, and is planned as such (the GPU demonstration's drafter,
    // head_dim 64, was planned as the kernel's and measured 25.6 % above it).
    step.block_kernel = step.cudnn && block_layout && request.dtype() == "bfloat16" &&
                        dflash::cuda_kernels::block_kernel_shape_fits(shape.heads, shape.kv_heads, shape.head_dim, step.block_size);
    // The CPU runs the block layout by the kernel's ATen reference (dflash_model.cpp).
    step.block_reference = !step.cuda && block_layout;
    step.keeps_rows = drafter::keeps_rows(
        drafter::attention_keeps_named(config.value("attention_keeps", std::string(kDefaultAttentionKeeps))), step.cudnn) ||
        step.block_kernel || step.block_reference;
    step.teacher = context.value("teacher", false);
    sdk::MemoryPlan plan = drafter::step_memory(shape, step);
    const int64_t q_out = shape.heads * shape.head_dim;
    plan.facts = {{"parameters", drafter::parameter_count(shape)},
                  {"largest_parameter", std::max({shape.intermediate * shape.hidden, q_out * shape.hidden,
                                                  shape.hidden * shape.feature_layers * shape.target_hidden})},
                  {"target_layer_ids", resolved.layer_ids},
                  {"loss_rows", step.rows * step.anchors * (step.block_size - 1)},
                  {"hidden_size", shape.hidden},
                  {"block_tokens", step.rows * step.anchors * step.block_size}};
    return plan;
  }

  sdk::TensorDict parameters() {
    sdk::TensorDict out;
    for (const auto& [name, tensor] : bound().parameters()) out.set(name, tensor);
    return out;
  }

  sdk::TensorDict forward(const sdk::TensorDict& inputs) {
    const drafter::DFlashModel& model = bound();
    const at::Tensor ids = inputs.at("input_ids");
    const at::Tensor loss_mask = inputs.at("loss_mask");
    at::Tensor positions = inputs.get("position_ids");
    at::Tensor documents = inputs.get("document_ids");
    const int64_t rows = ids.size(0), length = ids.size(1);
    if (!positions.defined()) positions = at::arange(length, at::kLong).expand({rows, length});
    if (!documents.defined()) documents = positions.to(at::kCPU, at::kLong).eq(0).to(at::kLong).cumsum(1);
    const at::Tensor seed_tensor = inputs.get("sample_seed");
    const uint64_t seed = seed_tensor.defined() ? static_cast<uint64_t>(seed_tensor.item<int64_t>()) : seed_ + ++calls_;

    const at::Tensor anchors = drafter::sample_anchors(loss_mask, documents, max_anchors_, seed);
    const drafter::BlockLayout layout =
        drafter::layout_blocks(ids, positions, documents, loss_mask, anchors, block_size_, mask_token_);
    const drafter::BlockMasks masks{anchors, documents, block_size_, group_blocks_, group_key_multiple_, block_kernel_};

    std::vector<at::Tensor> features;
    // Host tensors go up without waiting for the device (host_upload.h): the
    // step's kernels stay queued while the host prepares the next ones.
    auto up = [&](const at::Tensor& t) { return decode_support::on_device(t, device_); };
    for (int64_t id : layer_ids_) features.push_back(up(inputs.at("hidden." + std::to_string(id))));
    const int64_t slots = layout.slot_ids.size(1), hidden = model.shape().hidden;
    const at::Tensor slot_embeddings = slot_embeddings_of(layout.slot_ids).view({rows, slots, hidden});
    const at::Tensor out = model.forward(at::cat(features, -1), up(positions), slot_embeddings, up(layout.slot_positions),
                                         masks);  // [B, Q, H]

    // Rows for the loss: every slot k ≥ 1 of a real block.
    const at::Tensor slot = at::arange(slots, at::kLong).remainder(block_size_).expand({rows, slots});
    const at::Tensor keep = layout.block_valid.logical_and(slot.ne(0)).flatten().nonzero().flatten();  // CPU
    const at::Tensor keep_device = up(keep);
    sdk::TensorDict result{
        {"hidden", out.reshape({rows * slots, hidden}).index_select(0, keep_device)},
        {"targets", up(layout.targets.flatten().index_select(0, keep))},
        {"row_weights", up(weights_.index_select(0, slot.flatten().index_select(0, keep)))},
        {"slot", up(slot.flatten().index_select(0, keep))}};
    const at::Tensor last = inputs.get("last_hidden");
    if (last.defined()) {
      const at::Tensor row_of = at::arange(rows, at::kLong).view({rows, 1}).expand({rows, slots}).flatten().index_select(0, keep);
      const at::Tensor flat_index = up(row_of * length + layout.teacher_index.flatten().index_select(0, keep));
      result.set("teacher_hidden", last.reshape({rows * length, last.size(-1)}).index_select(0, flat_index));
    }
    return result;
  }

  // Speculative drafting: one context per session. The context holds the
  // accepted positions' target features (their keys and values in every
  // layer, computed once); a proposal runs one block — the newest token at
  // slot 0, MASK after it — and reads the slots' greedy tokens. Nothing here
  // waits for the device: proposals are returned where they were computed.
  int64_t draft_begin() {
    bound();
    drafter::DraftContext context;
    if (graphs_possible_ && spare_.capacity > 0) {  // the graphs read these buffers' addresses: reuse them
      context = std::move(spare_);
      spare_ = drafter::DraftContext{};
      context.length = 0;
    }
    drafts_.emplace(next_draft_, std::move(context));
    return next_draft_++;
  }
  void draft_extend(int64_t session, const sdk::TensorDict& inputs) {
    drafter::DraftContext& context = draft_context(session);
    const int64_t n = inputs.at("input_ids").numel();
    std::vector<at::Tensor> features;
    for (int64_t id : layer_ids_) {
      const at::Tensor h = inputs.get("hidden." + std::to_string(id));
      if (!h.defined())
        throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_extend: the target's hidden." + std::to_string(id) +
                                                          " is missing (this drafter reads target_layer_ids)");
      if (h.dim() != 2 || h.size(0) != n)
        throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_extend: hidden." + std::to_string(id) + " must be [" +
                                                          std::to_string(n) + ", hidden_size], one row per input id");
      features.push_back(h);
    }
    if (n == 0) return;
    const c10::NoGradGuard no_grad;
    flush_held_extension(session, context);  // two extensions in a row: the first goes in now
    if (hold_for_proposal(session, features, n)) return;
    bound().extend_context(context, at::cat(features, -1));
  }
  at::Tensor draft_propose(int64_t session, const sdk::TensorDict& inputs, int64_t count) {
    drafter::DraftContext& context = draft_context(session);
    const c10::NoGradGuard no_grad;
    const at::Tensor last = inputs.at("last_token").reshape({-1});
    if (last.numel() != 1) throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_propose: last_token must hold one id");
    const int64_t take = std::max<int64_t>(0, std::min(count, block_size_ - 1));
    if (take == 0) return at::empty({0}, at::kLong);
    at::Tensor proposal;
    if (held_rows_ > 0 && held_session_ == session) {
      if (propose_after_extension(context, last, take, proposal)) return proposal;
      flush_held_extension(session, context);
    }
    if (propose_graphed(context, last, take, proposal)) return proposal;
    // The block's ids where the embedding is: the newest token, then MASK.
    at::Tensor slot_ids;
    if (last.device().is_cpu()) {
      std::vector<int64_t> ids(static_cast<size_t>(block_size_), mask_token_);
      ids[0] = last.to(at::kLong).item<int64_t>();
      slot_ids = decode_support::upload(ids, embed_.device());
    } else {
      slot_ids = at::cat({last.to(embed_.device(), at::kLong),
                          at::full({block_size_ - 1}, mask_token_, at::TensorOptions().dtype(at::kLong).device(embed_.device()))});
    }
    const at::Tensor hidden = bound().draft(context, embed_.index_select(0, slot_ids).to(device_));
    return at::linear(hidden.narrow(0, 1, take), draft_lm_head_).argmax(-1);
  }
  // A tree's candidates (DDTree): the same block pass as draft_propose (with
  // a held extension folded in, as CUDA graphs where draft_propose has them),
  // and each slot's best k tokens with their log-probabilities (log-softmax
  // in fp32) instead of the argmax alone.
  sdk::TopKProposal draft_propose_topk(int64_t session, const sdk::TensorDict& inputs, int64_t count, int64_t k) {
    drafter::DraftContext& context = draft_context(session);
    const c10::NoGradGuard no_grad;
    const at::Tensor last = inputs.at("last_token").reshape({-1});
    if (last.numel() != 1) throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_propose_topk: last_token must hold one id");
    if (k > vocab_)
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_propose_topk: k " + std::to_string(k) + " is beyond the vocabulary's " +
                                                        std::to_string(vocab_) + " tokens");
    const int64_t take = std::max<int64_t>(0, std::min(count, block_size_ - 1));
    const auto longs = at::TensorOptions().dtype(at::kLong);
    if (take == 0) return sdk::TopKProposal{at::empty({0, k}, longs), at::empty({0, k}, at::kFloat)};
    at::Tensor tokens, log_probs_out;
    if (held_rows_ > 0 && held_session_ == session) {
      if (propose_after_extension(context, last, take, tokens, k, &log_probs_out)) return sdk::TopKProposal{tokens, log_probs_out};
      flush_held_extension(session, context);
    }
    if (propose_graphed(context, last, take, tokens, k, &log_probs_out)) return sdk::TopKProposal{tokens, log_probs_out};
    at::Tensor slot_ids = at::full({block_size_}, mask_token_, longs.device(embed_.device()));
    slot_ids.narrow(0, 0, 1).copy_(last.to(at::kLong));
    const at::Tensor hidden = bound().draft(context, embed_.index_select(0, slot_ids).to(device_));
    const at::Tensor log_probs = at::log_softmax(at::linear(hidden.narrow(0, 1, take), draft_lm_head_).to(at::kFloat), -1);
    const auto [values, indices] = log_probs.topk(k, -1, /*largest=*/true, /*sorted=*/true);
    return sdk::TopKProposal{indices, values};
  }
  // Back to training after an evaluation: what drafting keeps between
  // sessions — the graphs, the spare context, the fused path's copies of the
  // projections — is freed, so training has the memory it was planned with.
  // The next drafting call builds it again.
  void set_training(bool training) {
    if (!training || !model_) return;
    graphs_.clear();
    graph_pool_->renew();
    spare_ = drafter::DraftContext{};
    held_features_ = at::Tensor();  // after the graphs that read it
    held_rows_ = 0;
    model_->release_drafting();
  }
  void draft_end(int64_t session) {
    auto it = drafts_.find(session);
    if (it == drafts_.end()) return;
    if (held_session_ == session) held_rows_ = 0;  // an extension no proposal will follow
    if (graphs_possible_ && it->second.capacity >= spare_.capacity) spare_ = std::move(it->second);
    drafts_.erase(it);
  }

  // config.json as the reference DFlashDraftModel reads it (export_format.h).
  // The config.json keys a checkpoint must share before its weights load
  // here: the architecture's shape (a head count can differ where every
  // weight's shape agrees), and the target's vocabulary and width.
  nlohmann::json checkpoint_match() const {
    return {{"drafter", {"num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                         "mask_token_id"}},
            {"target", {{"vocab_size", "vocab_size"}, {"hidden_size", "hidden_size"}}}};
  }
  nlohmann::json export_config() const {
    drafter::ExportFacts facts;
    facts.target_layers = target_layers_;
    facts.vocab = vocab_;
    facts.max_position_embeddings = max_position_embeddings_;
    facts.layer_ids = layer_ids_;
    facts.block_size = block_size_;
    facts.mask_token = mask_token_;
    facts.max_anchors = max_anchors_;
    facts.gamma = gamma_;
    facts.init_std = config_.at("init_std").get<double>();
    return drafter::export_config(bound().shape(), facts);
  }

 private:
  drafter::DraftContext& draft_context(int64_t session) {
    auto it = drafts_.find(session);
    if (it == drafts_.end())
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "no drafting session " + std::to_string(session) + " (ended, or never begun)");
    return it->second;
  }
  // CUDA graphs of drafting (decode_graphs): the proposal alone, and the
  // proposal after a held extension, captured on their second use against
  // one context's buffers, used while that context is the only one open.
  struct Graph : decode_support::GraphedStep {
    at::Tensor params, mask_tail, slots, out;  // static inputs and output
    at::Tensor log_probs;                        // a top-k proposal's second output
  };
  // Graph keys: kind + kKindsPerHead · k, where k is a top-k proposal's
  // candidates per slot (0: the argmax proposal).
  static constexpr int64_t kPropose = 0, kExtendAndPropose = 1, kKindsPerHead = 2;
  // The proposal's head over the block's slot rows: the argmax (k = 0), or
  // each slot's best k tokens with their fp32 log-probabilities.
  void propose_head(const at::Tensor& rows, int64_t k, Graph& g) const {
    const at::Tensor logits = at::linear(rows, draft_lm_head_);
    if (k == 0) {
      g.out = logits.argmax(-1);
      return;
    }
    auto [values, indices] = at::log_softmax(logits.to(at::kFloat), -1).topk(k, -1, /*largest=*/true, /*sorted=*/true);
    g.out = indices;
    g.log_probs = values;
  }
  // The graph of `key`, valid for this context's buffers; null when this call runs eagerly.
  Graph* graph_for(drafter::DraftContext& context, int64_t key) {
    if (!graphs_possible_ || drafts_.size() != 1) return nullptr;
    if (context.generation != graphs_generation_) {
      graphs_.clear();
      graph_pool_->renew();
      graphs_generation_ = context.generation;
    }
    Graph& g = graphs_[key];
    if (!g.take()) return nullptr;  // the first use runs eagerly
    return &g;
  }
  // Captures the step on first call, then replays it; false (logged) when the
  // capture failed: the warm-up's writes are the ones the eager call repeats.
  bool replay(Graph& g, const std::function<void()>& body) {
    if (graph_pool_->replay(g, graph_stats_, body)) return true;
    host_->log(DFLASH_LOG_WARN, info.name,
               ("drafting step not captured as a CUDA graph (it runs eagerly): " + graph_stats_.last_error).c_str());
    return false;
  }
  // The fused step (decode_graphs): an extension of up to block_size rows
  // is held back in held_features_ (draft_extend copies it there) and runs
  // with the next proposal as one pass of fixed shape
  // (DFlashModel::extend_and_draft_at), one CUDA graph for every accepted
  // count: a step of speculative decoding is then one replay here. Held only
  // while graphs can replay (one session open); anything else that comes
  // first sends it through the plain extension.
  bool hold_for_proposal(int64_t session, const std::vector<at::Tensor>& features, int64_t n) {
    if (!graphs_possible_ || drafts_.size() != 1 || n > block_size_) return false;
    int64_t width = 0;
    for (const at::Tensor& f : features) {
      if (f.device() != device_ || f.scalar_type() != features[0].scalar_type()) return false;
      width += f.size(1);
    }
    if (!held_features_.defined())  // zeros: the rows past an extension are read (as scratch) before any is written
      held_features_ = at::zeros({block_size_, width}, features[0].options());
    if (held_features_.size(1) != width || held_features_.scalar_type() != features[0].scalar_type()) return false;
    at::Tensor rows = held_features_.narrow(0, 0, n);
    at::cat_out(rows, features, -1);
    held_session_ = session;
    held_rows_ = n;
    return true;
  }
  void flush_held_extension(int64_t session, drafter::DraftContext& context) {
    if (held_rows_ == 0 || held_session_ != session) return;
    bound().extend_context(context, held_features_.narrow(0, 0, held_rows_));
    held_rows_ = 0;
  }
  bool propose_after_extension(drafter::DraftContext& context, const at::Tensor& last, int64_t take, at::Tensor& proposal,
                               int64_t k = 0, at::Tensor* log_probs = nullptr) {
    if (!graphs_possible_ || drafts_.size() != 1) return false;
    bound().reserve(context, context.length + held_features_.size(0) + block_size_);
    bound().prepare_drafting(context);
    const int64_t key = kExtendAndPropose + kKindsPerHead * k;
    Graph* g = graph_for(context, key);  // null: this call runs eagerly (the same body)
    Graph& step = graphs_[key];
    const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
    const int64_t rows = held_features_.size(0);
    if (!step.params.defined()) {
      // The step's one upload: the newest token, then where its rows go
      // (extend_and_draft_positions: R + Bs positions, L + n, the key range).
      step.params = at::empty({4 + rows + block_size_}, longs);
      // The block's embeddings: MASK in every slot; slot 0 takes the newest token's in each step.
      step.slots = embed_.index_select(0, at::full({block_size_}, mask_token_, longs));
    }
    std::vector<int64_t> values = {last.device().is_cpu() ? last.to(at::kLong).item<int64_t>() : 0};
    const std::vector<int64_t> positions = drafter::extend_and_draft_positions(context.length, held_rows_, rows, block_size_);
    values.insert(values.end(), positions.begin(), positions.end());
    step.params.copy_(decode_support::host_staging(values, device_), /*non_blocking=*/true);
    if (!last.device().is_cpu()) step.params.narrow(0, 0, 1).copy_(last.to(device_, at::kLong));
    const drafter::ExtendAndDraftPositions where =
        drafter::extend_and_draft_views(step.params.narrow(0, 1, rows + block_size_ + 3), rows, block_size_);
    auto body = [&] {
      at::Tensor newest = step.slots.narrow(0, 0, 1);
      at::index_select_out(newest, embed_, 0, step.params.narrow(0, 0, 1));
      const at::Tensor hidden = bound().extend_and_draft_at(context, held_features_, step.slots, where);
      propose_head(hidden.narrow(0, 1, block_size_ - 1), k, step);
    };
    if (!g || !replay(*g, body)) body();
    context.length += held_rows_;
    held_rows_ = 0;
    proposal = step.out.narrow(0, 0, take).clone();  // the graphs' pool is reused by the next replay
    if (log_probs != nullptr) *log_probs = step.log_probs.narrow(0, 0, take).clone();
    return true;
  }
  bool propose_graphed(drafter::DraftContext& context, const at::Tensor& last, int64_t take, at::Tensor& proposal,
                       int64_t k = 0, at::Tensor* log_probs = nullptr) {
    if (!graphs_possible_) return false;
    bound().reserve(context, context.length + block_size_);
    bound().prepare_drafting(context);
    Graph* g = graph_for(context, kPropose + kKindsPerHead * k);
    if (!g) return false;
    const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
    if (!g->graph) {
      g->params = at::empty({2}, longs);  // the newest token, the context's length
      g->mask_tail = at::full({block_size_ - 1}, mask_token_, longs);
    }
    if (last.device().is_cpu()) {
      g->params.copy_(decode_support::host_staging({last.to(at::kLong).item<int64_t>(), context.length}, device_),
                      /*non_blocking=*/true);
    } else {
      g->params.narrow(0, 0, 1).copy_(last.to(device_, at::kLong));
      g->params.narrow(0, 1, 1).fill_(context.length);
    }
    auto body = [&] {
      const at::Tensor slot_ids = at::cat({g->params.narrow(0, 0, 1), g->mask_tail});
      const at::Tensor hidden = bound().draft_at(context, embed_.index_select(0, slot_ids), g->params.narrow(0, 1, 1));
      propose_head(hidden.narrow(0, 1, block_size_ - 1), k, *g);
    };
    if (!replay(*g, body)) return false;
    proposal = g->out.narrow(0, 0, take).clone();  // the graphs' pool is reused by the next replay
    if (log_probs != nullptr) *log_probs = g->log_probs.narrow(0, 0, take).clone();
    return true;
  }

  const drafter::DFlashModel& bound() const {
    if (!model_) throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "drafter 'dflash': bind_target must come first (it sizes the layers)");
    return *model_;
  }

  const dflash_host_api* host_;
  nlohmann::json config_;
  uint64_t seed_, calls_ = 0;
  c10::ScalarType dtype_;
  c10::Device device_;
  int64_t block_size_, max_anchors_, vocab_ = 0, mask_token_ = 0, group_blocks_ = 0, group_key_multiple_ = 128;
  bool block_kernel_ = false;  // attention: blocks
  int64_t target_layers_ = 0, max_position_embeddings_ = 0;
  double gamma_;
  std::vector<int64_t> layer_ids_;
  at::Tensor embed_, lm_head_, weights_;
  std::map<int64_t, drafter::DraftContext> drafts_;
  int64_t next_draft_ = 1;
  at::Tensor draft_lm_head_;
  bool graphs_possible_ = false;
  std::unique_ptr<decode_support::CudaGraphPool> graph_pool_;
  std::map<int64_t, Graph> graphs_;
  uint64_t graphs_generation_ = 0;
  // Drafting's graphs over this instance's life, logged when it ends: where
  // a decode is slower than expected, whether its steps replayed.
  decode_support::GraphStats graph_stats_;
  drafter::DraftContext spare_;  // an ended session's buffers, for the next (graphs read their addresses)
  // The held extension (hold_for_proposal): its rows, first of [block_size,
  // F·Ht] (the fused step's graph reads this buffer), and whose they are.
  at::Tensor held_features_;
  int64_t held_session_ = 0, held_rows_ = 0;
  std::unique_ptr<drafter::DFlashModel> model_;
};

}  // namespace

DFLASH_PLUGINS(DFlashDrafter)
