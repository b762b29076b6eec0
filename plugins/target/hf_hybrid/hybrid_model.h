// A Qwen3.5 / Qwen3.6 hybrid decoder for inference (frozen): Gated DeltaNet
// ("linear attention") layers and gated full-attention layers in the order
// config.json's layer_types gives, each followed by a dense SwiGLU MLP
// (qwen3_5) or a Mixture of Experts with a shared expert (qwen3_5_moe).
// Loads a Hugging Face folder (the text model of a multimodal checkpoint
// too), runs packed training rows returning chosen layers' hidden states,
// and decodes sessions incrementally. No autograd graph is kept.
//
// The arithmetic follows transformers' Qwen3_5 modules step by step (the
// rounding points of bf16 included): RMSNorm as x̂ · (1 + w) in fp32, then
// rounded; the delta rule in fp32; the gated RMSNorm of the linear layers'
// output; rotary tables formed in fp32 as transformers forms them.
#pragma once

#include "hybrid_config.h"
#include "linear_state_pool.h"

#include <decode_sessions.h>
#include <exact_decoding.h>
#include <graph_stats.h>
#include <moe.h>

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <vector>

namespace dflash::target {

// A Gated DeltaNet layer's weights. The four input projections read the same
// input, so they are one GEMM: in_proj = [qkv; z; b; a] by rows.
struct LinearAttentionWeights {
  at::Tensor in_proj;  // [conv_dim + value_dim + 2 Hv, H]
  at::Tensor conv;     // [conv_dim, K]
  at::Tensor a_log, dt_bias;  // [Hv]
  at::Tensor norm;     // [dv], the gated RMSNorm's weight (w · x̂, not 1 + w)
  at::Tensor out;      // [H, value_dim]
};

// A full-attention layer's weights: qkv = [q_proj; k_proj; v_proj] by rows,
// q_proj yielding each head's query and output gate side by side.
struct FullAttentionWeights {
  at::Tensor qkv;             // [2 heads hd + 2 kv_heads hd, H]
  at::Tensor q_norm, k_norm;  // [hd], fp32 (1 + w)
  at::Tensor o;               // [H, heads hd]
};

struct HybridLayerWeights {
  Mixer mixer = Mixer::kLinearAttention;
  at::Tensor input_norm, post_attention_norm;  // fp32 (1 + w)
  LinearAttentionWeights linear;
  FullAttentionWeights full;
  at::Tensor gate_up, down;  // dense MLP
  hf::MoeWeights moe;        // MoE MLP (config.is_moe())
};

struct HybridOutputs {
  std::map<int64_t, at::Tensor> layers;  // output of decoder layer i, [B, S, H]
  at::Tensor last_hidden;                // after the final norm
  at::Tensor logits;
};

struct HybridOptions {
  // Chain decoding steps of up to kernel_ops::kInvariantMaxRows tokens on the
  // GPU run row-invariant kernels (every projection, the full-attention
  // layers' attention; the norms, the convolution and the recurrent delta
  // rule already compute a row alone), so a token verified in a drafted block
  // gets bitwise the logits it gets decoded alone (docs/target.md). Where:
  // CUDA bf16/fp16, no experts, every projection's input width a multiple of
  // 8, head_dim ≤ 256 and a session's scores fitting in shared memory.
  decode_support::ExactDecoding exact_decoding = decode_support::ExactDecoding::kAuto;
  // A single session's exact steps (eval's decoding: a token, a verified
  // block) captured as CUDA graphs on a shape's second use and replayed from
  // then on (decode_support/cuda_graph.h); the KV pool then stays allocated
  // between sessions (the graphs read its addresses). Only where exact
  // decoding applies: its kernels' steps read nothing back to the host.
  bool decode_graphs = true;
};

// Which logits a decoding step returns.
enum class HybridLogits { kNone, kAll, kLast };

class HybridModel {
 public:
  // Reads config.json and the safetensors (one file or an index's shards);
  // a multimodal folder's text model is read from model.language_model.*,
  // its vision tower ignored (vision_tensors() says how many). Throws
  // std::runtime_error naming the file, key or tensor.
  // options.exact_decoding kOn where it cannot apply throws, naming the setting.
  HybridModel(const std::filesystem::path& model_dir, c10::ScalarType dtype, c10::Device device,
              const HybridOptions& options = {});
  ~HybridModel();

  const HybridConfig& config() const { return config_; }
  const at::Tensor& embed_tokens() const { return embed_; }
  const at::Tensor& lm_head() const { return lm_head_; }
  // The final norm as the drafter applies it, x̂ · w: (1 + w) of the checkpoint.
  const at::Tensor& final_norm() const { return final_norm_scale_; }
  int64_t ignored_tensors() const { return ignored_tensors_; }
  // Whether decoding steps run exact decoding's kernels (HybridOptions).
  bool uses_exact_decoding() const { return exact_decoding_; }
  // Whether single-session exact steps replay CUDA graphs, and how that went.
  bool uses_decode_graphs() const { return graphs_ != nullptr; }
  const decode_support::GraphStats& decode_graph_stats() const;
  const std::string& text_prefix() const { return prefix_; }

  // input_ids [B, S]; position_ids [B, S] (restarting per packed document)
  // and document_ids [B, S] optional, as hf_decoder's forward: without
  // document_ids a position id of 0 starts a document; without either each
  // row is one document. Linear layers restart their convolution window and
  // state at every document start; attention is causal within documents.
  HybridOutputs forward(const at::Tensor& input_ids, const at::Tensor& position_ids, const at::Tensor& document_ids,
                        const std::vector<int64_t>& layer_ids, bool want_last_hidden, bool want_logits) const;

  // Incremental decoding over sessions: KV caches of the full-attention
  // layers (pooled, hf::DecodeSessions) and per session the conv windows and
  // recurrent states of the linear layers. extend appends tokens [count, n]
  // (row i to sessions[i]); truncate cuts a session back to `length`, which
  // for the linear layers' states must lie within its last extend (a
  // speculative step's verified block) — their state before that is gone.
  int64_t begin(int64_t capacity);
  void end(int64_t session);
  HybridOutputs extend(const std::vector<int64_t>& sessions, const at::Tensor& tokens,
                       const std::vector<int64_t>& layer_ids, HybridLogits logits);
  void truncate(int64_t session, int64_t length);
  int64_t length(int64_t session);

  // A draft tree (ABI 1.4), as hf_decoder's (decoder.h): node i below node
  // parents[i] (−1: the last cached token), at position length + depth − 1,
  // attending to the cache, its ancestors and itself. The full-attention
  // layers keep the nodes' keys and values at cache rows [length, length + n)
  // (the session's length covers them until accept_path); the linear layers
  // run depth by depth, each node from its parent's window and state, and
  // keep only the nodes' inputs: accept_path replays the rule along the kept
  // path from the state before the tree (the same operations in the same
  // order, as truncate replays a step), then makes that path the session's
  // last step. The caller checks that `path` is a chain of the tree.
  HybridOutputs verify_tree(int64_t session, const at::Tensor& tokens, const std::vector<int64_t>& parents,
                            const std::vector<int64_t>& layer_ids, bool want_logits);
  void accept_path(int64_t session, int64_t tree_start, const std::vector<int64_t>& path);

 private:
  struct SessionStates;
  struct StepPlan;
  struct StepResult;
  struct DecodeGraphs;
  // One decoding step's device work from device inputs alone: tokens
  // [count·n], params [count, 3] (pool row, length, current linear-state
  // buffer); writes the KV caches and the linear layers' other buffers.
  StepResult step(const StepPlan& plan, const at::Tensor& tokens, const at::Tensor& params);
  bool step_graphed(const StepPlan& plan, const at::Tensor& tokens, const std::vector<int64_t>& params,
                    const std::vector<int64_t>& layer_ids, StepResult& result);
  at::Tensor rotary_cos_sin(const at::Tensor& positions) const;  // [N] → [N, 2, rotary_dim] in dtype
  at::Tensor mlp(const HybridLayerWeights& w, const at::Tensor& x, bool invariant = false) const;
  // Whether a step of this many tokens runs exact decoding's kernels; with
  // exact_decoding on, throws where a session's scores would not fit.
  bool exact_step(int64_t tokens_in_step, const char* call) const;
  void decide_exact_decoding(const std::filesystem::path& dir, decode_support::ExactDecoding setting);

  HybridConfig config_;
  std::string prefix_;  // "model." or "model.language_model."
  int64_t ignored_tensors_ = 0;
  bool exact_decoding_ = false, exact_required_ = false;
  at::Tensor embed_, lm_head_, final_norm_, final_norm_scale_, inv_freq_;
  std::vector<HybridLayerWeights> layers_;
  std::vector<int64_t> full_index_, linear_index_;  // per layer: its ordinal among its kind, or -1
  hf::DecodeSessions kv_;
  std::map<int64_t, SessionStates> states_;
  LinearStatePool linear_states_;  // the linear layers' windows and states, by SessionStates::slot
  std::unique_ptr<DecodeGraphs> graphs_;  // null: every step eager
};

}  // namespace dflash::target
