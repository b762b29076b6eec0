// The DFlash block drafter's layers: `fc` + RMSNorm over the concatenated
// target features, injected as extra keys/values into every Qwen3-style layer
// (q/k RMSNorm, RoPE, GQA, SwiGLU); queries come only from the block slots.
#pragma once

#include "block_layout.h"
#include "grouped_attention.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dflash::drafter {

class DraftingFastPath;

struct DrafterShape {
  int64_t layers = 1, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int64_t feature_layers = 1;  // target layers concatenated into fc's input
  int64_t target_hidden = 0;   // the target's hidden size (fc input = feature_layers × target_hidden)
  double rms_norm_eps = 1e-6, rope_theta = 1e6;
};

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// What the layers need to build the blocks' attention pattern: the anchors
// and documents (CPU, as block_layout has them) and how to cut the pattern.
struct BlockMasks {
  at::Tensor anchors;    // [B, A] ascending, −1 = padding block
  at::Tensor documents;  // [B, S]
  int64_t block_size = 0;
  // > 0: attention in groups of this many blocks (attention_groups); 0: one
  // call per row with the whole dense mask (block_attention_mask).
  int64_t group_blocks = 0;
  // Grouped: context ranges widened to a multiple of this many keys
  // (attention_groups' key_multiple; the plugin's attention_group_key_multiple),
  // so calls come in few shapes. 1: exact ranges.
  int64_t group_key_multiple = 1;
  // Block attention (block_kernel_layout, prefix_block_attention) where the
  // kernels take this step (CUDA bf16, their head shape, cuDNN's by-hand
  // backward working) and, by its ATen reference, on the CPU (slow: for
  // tests); grouped (by group_blocks) elsewhere.
  bool block_kernel = false;
};

// Whether a step with drafter.attention "blocks" takes the block layout:
// grouped, of a block size the block kernel takes, whole KV groups. Then the
// CPU runs the kernel's ATen reference, and the GPU the kernel itself where
// cuDNN's attention works there. One rule for the step and its memory plan.
inline bool takes_block_layout(int64_t group_blocks, int64_t block_size, int64_t heads, int64_t kv_heads) {
  return group_blocks > 0 && cuda_kernels::block_size_fits(block_size) && kv_heads > 0 && heads % kv_heads == 0;
}

// One sequence's context for speculative drafting: every layer's keys and
// values of the accepted positions (after k-norm and RoPE), computed once when
// the positions are accepted and reused by every later proposal. The buffers
// are allocated ahead (reserve) and written in place: rows [0, length) hold
// the context, and a proposal writes its block's own keys and values right
// after them, as scratch that the next extension overwrites.
struct DraftContext {
  std::vector<at::Tensor> keys, values;  // per layer [capacity, kv_heads, head_dim]
  int64_t length = 0;
  int64_t capacity = 0;
  // Changes whenever the buffers move (a captured CUDA graph reads their addresses).
  uint64_t generation = 0;
  // The fused drafting path's rotary table (drafting_fast_path.h): cos and
  // sin of positions [0, capacity), fp32 [2, capacity, head_dim/2]; rebuilt
  // only when it is shorter than the buffers, so it moves only after they do.
  at::Tensor rotary;
};

// Where DFlashModel::extend_and_draft_at puts its rows, for a context of
// length L that gains n of R feature rows: context row j goes to L + j for
// j < n and, past them, to L + j + Bs (scratch after the block, never
// attended to, overwritten later); the block's slots go to L + n + [0, Bs).
// The values, in the order they are uploaded: the R context positions, the
// Bs block positions, L + n, then the keys the block sees as a range
// (0, L + n + Bs) (worked out on the host: the step's inputs go up in one copy).
std::vector<int64_t> extend_and_draft_positions(int64_t length, int64_t accepted, int64_t rows, int64_t slots);
// Those values [R + Bs + 3] (int64, on the device) as extend_and_draft_at reads them.
struct ExtendAndDraftPositions {
  at::Tensor context;     // [R]
  at::Tensor block;       // [Bs]
  at::Tensor all;         // [R + Bs]: context, then block
  at::Tensor block_base;  // [1]: L + n, the context's length after the extension
  at::Tensor key_range;   // [2]: 0, L + n + Bs
};
ExtendAndDraftPositions extend_and_draft_views(const at::Tensor& values, int64_t rows, int64_t slots);

class DFlashModel {
 public:
  // Weights ~ N(0, init_std) (norms 1) drawn on the CPU from `seed` in fp32,
  // then placed on device in dtype: the same seed gives the same drafter on
  // any device.
  DFlashModel(const DrafterShape& shape, uint64_t seed, double init_std, c10::ScalarType dtype, c10::Device device);

  const DrafterShape& shape() const { return shape_; }
  // Live leaves, Hugging Face-style names ("layers.0.self_attn.q_proj.weight", "fc.weight", ...).
  const NamedParameters& parameters() const { return parameters_; }
  // The final norm starts as a copy of the target's (the drafter's hidden
  // states feed the target's lm_head).
  void init_final_norm(const at::Tensor& target_final_norm);
  // Keep only each layer's inputs for backward and run the layer again there.
  void set_activation_checkpointing(bool on) { activation_checkpointing_ = on; }
  // kAuto: cuDNN's fused attention where it runs and agrees with SDPA (CUDA,
  // bf16/fp16, LibTorch ≥ 2.5; checked once per process), SDPA elsewhere.
  enum class AttentionKernel { kAuto, kSdpa };
  void set_attention_kernel(AttentionKernel kernel) { attention_kernel_ = kernel; }
  // How training's forward runs the norms, q/k norm + RoPE and the MLP.
  // kFused: trainable_ops' autograd functions (the shared CUDA kernels on a
  // GPU in bf16/fp16, closed forms elsewhere), which save only their inputs
  // and statistics; kAten: Hugging Face's op-by-op arithmetic through
  // autograd, the reference.
  enum class LayerOps { kFused, kAten };
  void set_layer_ops(LayerOps ops) { layer_ops_ = ops; }
  // Grouped attention: what backward keeps (grouped_attention.h's
  // AttentionKeeps: the layer's q/k/v rows, or every call's copies).
  void set_attention_keeps(AttentionKeeps keeps) { attention_keeps_ = keeps; }

  // features [B, S, F·Ht]; context_positions [B, S]; slot_embeddings [B, Q, H];
  // slot_positions [B, Q]; masks: the pattern. Returns the slots' hidden states after the final norm, [B, Q, H].
  at::Tensor forward(const at::Tensor& features, const at::Tensor& context_positions, const at::Tensor& slot_embeddings,
                     const at::Tensor& slot_positions, const BlockMasks& masks) const;

  // Drafting (no autograd). extend_context appends n accepted positions —
  // features [n, F·Ht] at positions [length, length + n) — to the context;
  // draft runs one block of slot_embeddings [Bs, H] at positions
  // [length, length + Bs) against the whole context (one document, so no
  // mask) and returns its hidden states after the final norm, [Bs, H]. Both
  // grow the buffers as needed; neither waits for the device.
  void extend_context(DraftContext& context, const at::Tensor& features) const;
  at::Tensor draft(DraftContext& context, const at::Tensor& slot_embeddings) const;

  // Buffers for at least `positions` positions (doubling; the valid rows move).
  void reserve(DraftContext& context, int64_t positions) const;
  // The same two steps with the context's length in device memory, base
  // int64 [1], so a CUDA graph can capture them: nothing host-side depends
  // on the length (positions, cache rows and the attention's key count are
  // worked out on the device). The plugin captures draft_at (the first
  // proposal) and extend_and_draft_at below; extend_context_at is the
  // extension alone, checked against the host-length path by the tests. The buffers must already hold base + n (+ Bs)
  // positions, and the caller advances context.length itself.
  // draft_at attends through flash attention over variable-length keys:
  // only where flash_drafting() says so.
  void extend_context_at(DraftContext& context, const at::Tensor& features, const at::Tensor& base) const;
  at::Tensor draft_at(DraftContext& context, const at::Tensor& slot_embeddings, const at::Tensor& base) const;
  bool flash_drafting() const;
  // extend_context_at then draft_at as one call of fixed shape, whatever the
  // number accepted: features [R, F·Ht] of which the first n rows join the
  // context at L, then the block at L + n, at the positions `where` gives
  // (extend_and_draft_positions, on the model's device). One CUDA graph
  // serves every accepted count; the fused path runs it as one pass. The
  // buffers must hold L + R + Bs positions; the caller advances
  // context.length by n. Only where flash_drafting() says so.
  at::Tensor extend_and_draft_at(DraftContext& context, const at::Tensor& features, const at::Tensor& slot_embeddings,
                                 const ExtendAndDraftPositions& where) const;

  // Drafting (the four calls above) through fused CUDA kernels where they
  // run (drafting_fast_path.h: a build with the kernels, and flash drafting);
  // off: the ATen path everywhere, the reference. On by default; training's
  // forward never uses them.
  void set_drafting_kernels(bool on) { drafting_kernels_ = on; }
  bool fused_drafting() const;
  // The fused path's state made current outside any CUDA graph capture, for
  // a caller about to replay one: each layer's fused projections rewritten
  // in place if a parameter changed since (their version counters), and the
  // context's rotary table sized to its buffers. Host-side checks only;
  // nothing on the ATen path. The drafting calls do the same themselves.
  void prepare_drafting(DraftContext& context) const;
  // Frees the fused projections; the next drafting call builds them again,
  // at new addresses (drop captured graphs first).
  void release_drafting() const;

 private:
  friend class DraftingFastPath;
  struct Layer {
    at::Tensor input_norm, q, k, v, o, q_norm, k_norm, post_norm, gate, up, down;
  };
  at::Tensor& add(const std::string& name, at::Tensor value);

  DrafterShape shape_;
  NamedParameters parameters_;
  at::Tensor fc_, hidden_norm_, final_norm_;
  std::vector<Layer> layers_;
  // Drafting's common part: features [n, F·Ht] at device positions [n].
  void write_context(DraftContext& context, const at::Tensor& features, const at::Tensor& positions) const;
  // A block's slots at device positions [Bs]; keys: the attention over the
  // context and the block (host_keys > 0: SDPA over that many; 0: flash
  // attention with the key count base + Bs on the device).
  at::Tensor run_block(DraftContext& context, const at::Tensor& slot_embeddings, const at::Tensor& positions,
                       int64_t host_keys, const at::Tensor& base) const;
  bool activation_checkpointing_ = false;
  AttentionKernel attention_kernel_ = AttentionKernel::kAuto;
  LayerOps layer_ops_ = LayerOps::kFused;
  AttentionKeeps attention_keeps_ = AttentionKeeps::kAuto;
  // The fused drafting path when it runs here and is on, else null.
  DraftingFastPath* drafting_fast_path() const;
  bool drafting_kernels_ = true;
  mutable std::shared_ptr<DraftingFastPath> drafting_fast_path_;  // built on first use
};

}  // namespace dflash::drafter
