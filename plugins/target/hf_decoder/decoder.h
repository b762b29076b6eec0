// A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Qwen3 MoE) for
// inference: loads a Hugging Face model directory and runs packed batches,
// returning the hidden states of chosen layers. No autograd graph is kept.
#pragma once

#include <decode_sessions.h>
#include <packed_rows.h>
#include "decoder_config.h"
#include "exact_decoding.h"
#include "graph_stats.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace dflash::target {

using DecodeSessions = hf::DecodeSessions;  // the KV cache pool (plugins/shared/hf_support)

// Projections that read the same input are stored concatenated, so each is
// one GEMM: qkv = [q; k; v] by rows, gate_up = [gate; up].
struct LayerWeights {
  at::Tensor input_norm, post_attention_norm;
  at::Tensor qkv, qkv_bias, o;  // qkv_bias undefined when the checkpoint has none
  at::Tensor q_norm, k_norm;    // Qwen3 only
  // The MLP: the dense SwiGLU, or (a sparse Qwen3 MoE layer,
  // DecoderConfig::is_sparse) the router and experts instead.
  at::Tensor gate_up, down;
  std::optional<hf::MoeWeights> moe;
};

struct DecoderOutputs {
  std::map<int64_t, at::Tensor> layers;  // output of decoder layer i (0-based), [B, S, H]
  at::Tensor last_hidden;                // after the final norm
  at::Tensor logits;
};

struct DecoderOptions {
  // The GPU path (fast_path.h) where it applies — a CUDA device, bf16/fp16, a
  // build with the kernels; false forces the ATen reference path everywhere.
  bool cuda_kernels = true;
  // GPU path: the batch's rows run as this many micro-batches on as many CUDA
  // streams (at most one per row).
  int64_t streams = 2;
  // GPU path: rows that are each one document use cuDNN's attention where it
  // works here; packed rows always use flash attention over documents.
  bool cudnn_attention = true;
  // Incremental decoding of one session on the GPU path: capture each step
  // shape (token count, layers returned, logits) as a CUDA graph on its second
  // use and replay it from then on (decode_support/cuda_graph.h). Needs flash
  // attention over the pooled caches (Decoder::uses_flash_decoding), and no
  // experts (a Qwen3 MoE step reads its routing back to the host, which a
  // graph cannot capture); false runs every step eagerly.
  bool decode_graphs = true;
  // Incremental decoding on the GPU path (decode_support/exact_decoding.h):
  // the row-invariant kernels (kernel_ops::invariant_*) wherever they hold
  // (the GPU decoding path, widths in multiples of 8, a session's scores
  // fitting in shared memory, no experts); kOn: the constructor and
  // decode_extend throw where they cannot.
  using Exact = decode_support::ExactDecoding;
  Exact exact_decoding = Exact::kAuto;
};

// The inputs of one forward, resolved once for either path.
struct PackedBatch : hf::PackedRows {  // ids, documents, starts, positions (hf_support/packed_rows.h)
  at::Tensor angles;  // [B·S, head_dim/2] fp64 rotary angles
};

// Which logits an incremental decoding step returns.
enum class LogitRows {
  kNone,
  kAll,   // [count, n, V]
  kLast   // [count, 1, V]: after each session's last new token
};

// What a Decoder would hold on its device, from config.json and the
// checkpoint's headers alone (nothing is loaded): its weights, and the
// working memory of one forward over [rows, row_length] tokens, not counting
// the hidden states it returns.
struct DecoderMemory {
  DecoderConfig config;
  uint64_t weight_bytes = 0;
  uint64_t forward_bytes = 0;
  bool cuda_kernels = false;  // whether the forward would take the GPU path
  int64_t side_streams = 0;   // CUDA streams the forward runs GEMMs on besides the caller's
};
DecoderMemory plan_decoder_memory(const std::filesystem::path& model_dir, c10::ScalarType dtype, const c10::Device& device,
                                  const DecoderOptions& options, int64_t rows, int64_t row_length);

class Decoder {
 public:
  // Reads config.json and model.safetensors (or the shards listed in
  // model.safetensors.index.json). Throws naming the file and tensor.
  Decoder(const std::filesystem::path& model_dir, c10::ScalarType dtype, c10::Device device,
          const DecoderOptions& options = {});
  ~Decoder();

  const DecoderConfig& config() const { return config_; }
  const at::Tensor& embed_tokens() const { return embed_; }
  const at::Tensor& lm_head() const { return lm_head_; }
  const at::Tensor& final_norm() const { return final_norm_; }
  bool uses_cuda_kernels() const { return cuda_kernels_; }
  bool uses_cudnn_attention() const { return cudnn_attention_; }
  // Decoding attends straight over the pooled caches with flash attention
  // (fast_path::decode_attention): the GPU path, a head_dim flash takes.
  bool uses_flash_decoding() const { return flash_decoding_; }
  // Single-session decoding steps are replayed as CUDA graphs (never with
  // experts: routing reads each expert's token count back to the host).
  bool uses_decode_graphs() const { return decode_graphs_; }
  // Steps of up to 16 tokens run the row-invariant kernels (DecoderOptions;
  // never with experts).
  bool uses_exact_decoding() const { return exact_decoding_; }
  using GraphStats = decode_support::GraphStats;
  const GraphStats& decode_graph_stats() const;

  // input_ids [B, S]; position_ids [B, S] (restarting per packed document)
  // and document_ids [B, S] are optional: without document_ids, a position id
  // of 0 starts a new document; without either, each row is one document.
  DecoderOutputs forward(const at::Tensor& input_ids, const at::Tensor& position_ids, const at::Tensor& document_ids,
                         const std::vector<int64_t>& layer_ids, bool want_last_hidden, bool want_logits) const;

  // Incremental decoding. new_sessions() is an empty pool of KV caches for
  // this model; extend appends tokens [count, n] to sessions (row i to
  // sessions[i], at positions [length, length + n) of that session), each
  // token attending causally to its own session's cache and the new tokens
  // before it. All rows go through each projection as one GEMM. Returns the
  // layers' outputs [count, n, H] and the logits asked for. An unknown or
  // repeated session, bad tokens, or a session that would pass its capacity
  // throw std::invalid_argument and change nothing. Tokens on the CPU are
  // checked against the vocabulary; tokens already on the model's device are
  // used as they are (checking them would wait for the device every step), so
  // they are the caller's to keep in range — a decoding loop feeds back the
  // model's own argmax.
  //
  // No step waits for the device: the sessions' rows and lengths go up in one
  // small asynchronous copy, and positions, rotary tables (precomputed),
  // cache slots and attention lengths are worked out on the device. One
  // session's steps may be replayed as CUDA graphs (DecoderOptions).
  DecodeSessions new_sessions() const;
  DecoderOutputs extend(DecodeSessions& sessions, const std::vector<int64_t>& ids, const at::Tensor& tokens,
                        const std::vector<int64_t>& layer_ids, LogitRows logits) const;
  // A draft tree (ABI 1.4): tokens [n] after session `id`'s cache, node i
  // below node parents[i] (−1: the last cached token), at position
  // length + depth − 1, attending to the cache, its ancestors and itself.
  // Its keys and values go to cache rows [length, length + n) in node
  // order, and the session's length then covers them until accept_path
  // keeps `path` (a chain, checked by the caller) at [length, length + m).
  // Throws std::invalid_argument, changing nothing, when the deepest node
  // passes the session's capacity (the pool's rows grow to hold the nodes).
  // The attention runs through the masked ATen form (exact_decoding's
  // row-invariant kernels take chains only).
  DecoderOutputs verify_tree(DecodeSessions& sessions, int64_t id, const at::Tensor& tokens,
                             const std::vector<int64_t>& parents, const std::vector<int64_t>& layer_ids, bool want_logits) const;
  void accept_path(DecodeSessions& sessions, int64_t id, int64_t tree_start, const std::vector<int64_t>& path) const;

 private:
  DecoderOutputs forward_kernels(const PackedBatch& batch, const std::set<int64_t>& wanted, bool want_last_hidden) const;
  DecoderOutputs forward_reference(const PackedBatch& batch, const std::set<int64_t>& wanted, bool want_last_hidden) const;

  struct DecodeState;  // rotary tables and CUDA graphs of incremental decoding (decoder.cpp)
  struct StepPlan;     // a decoding step's host-side facts (decoder.cpp)
  // The step itself, from tokens [count·n] and (row, length) [count, 2] on the
  // device; flash: attention through fast_path::decode_attention, which is
  // what a graph can capture.
  DecoderOutputs decode_step(DecodeSessions& pool, const StepPlan& plan, const at::Tensor& tokens, const at::Tensor& params,
                             const std::set<int64_t>& wanted, LogitRows logits, bool flash) const;
  // The step replayed as a CUDA graph; false when it runs eagerly instead.
  bool decode_step_graphed(DecodeSessions& pool, const StepPlan& plan, const at::Tensor& tokens,
                           const std::vector<int64_t>& params, const std::vector<int64_t>& layer_ids,
                           const std::set<int64_t>& wanted, LogitRows logits, DecoderOutputs& out) const;
  // Rotary tables covering positions [0, positions).
  void ensure_rotary_tables(int64_t positions) const;

  DecoderConfig config_;
  int64_t streams_ = 2;
  at::Tensor embed_, lm_head_, final_norm_, inv_freq_;
  std::vector<LayerWeights> layers_;
  bool cuda_kernels_ = false;
  bool cudnn_attention_ = false;
  bool flash_decoding_ = false;
  bool decode_graphs_ = false;
  bool exact_decoding_ = false;   // the row-invariant kernels are in use
  bool exact_required_ = false;   // exact_decoding: on (a step that cannot have them throws)
  std::unique_ptr<DecodeState> decode_;
};

}  // namespace dflash::target
