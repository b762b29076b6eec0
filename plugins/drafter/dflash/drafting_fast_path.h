// The dflash drafter's decoding (speculative drafting) on the GPU through the
// CUDA kernels it shares with the hf_decoder target (kernel_ops.h). At batch 1
// drafting is launch-bound: the ATen path spends ~8 kernels on each RMSNorm,
// ~6 on each RoPE and ~10 on rotary tables per call, and separate q/k/v and
// gate/up GEMMs. Here a layer of a proposal is RMSNorm → one [q; k; v] GEMM →
// q/k norm + RoPE with the block's keys and values written into the context
// cache (one kernel) → flash attention → o GEMM with the residual → RMSNorm → one
// [gate; up] GEMM → SwiGLU → down GEMM with the residual; an extension is
// fc → hidden norm, then per layer one [k; v] GEMM → k norm + RoPE into the
// cache. An extension followed by a proposal (extend_and_run_block) stacks
// the context's rows over the block's in each layer's [q; k; v] GEMM and
// rotary kernel: one pass, no separate extension.
//
// It runs where DFlashModel::fused_drafting() says so: this build carries the
// kernels, and the model drafts through flash attention (CUDA, bf16/fp16,
// head_dim a multiple of 8 up to 256, LibTorch ≥ 2.5). The ATen path in
// dflash_model.cpp stays the reference (and the only path elsewhere); the
// two agree to bf16 rounding (tests/plugins/drafter/dflash/drafting_fast_path_test.cpp).
//
// Nothing here waits for the device or reads a device value on the host, so
// every call can be captured in a CUDA graph. What such a graph reads at
// fixed addresses: the fused projections (rewritten in place when the
// parameters change) and the context's rotary table (which moves only with
// the context's buffers, when its generation changes).
#pragma once

#include "dflash_model.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace dflash::drafter {

class DraftingFastPath {
 public:
  // Whether the fused path can run `model` (see above).
  static bool runs(const DFlashModel& model);

  // The fused projections current with the model's parameters and the
  // context's rotary table covering its buffers (DFlashModel::prepare_drafting).
  void prepare(const DFlashModel& model, DraftContext& context);

  // DFlashModel::write_context and run_block on this path: the same
  // arguments, the same results to bf16 rounding.
  void write_context(const DFlashModel& model, DraftContext& context, const at::Tensor& features,
                     const at::Tensor& positions);
  at::Tensor run_block(const DFlashModel& model, DraftContext& context, const at::Tensor& slot_embeddings,
                       const at::Tensor& positions, int64_t host_keys, const at::Tensor& base);
  // DFlashModel::extend_and_draft_at in one pass: each layer projects the
  // context's rows and the block's together.
  at::Tensor extend_and_run_block(const DFlashModel& model, DraftContext& context, const at::Tensor& features,
                                  const at::Tensor& slot_embeddings, const ExtendAndDraftPositions& where);

 private:
  // Flash attention's offsets for a block of `slots` queries against the
  // keys [0, host_keys) or, with host_keys = 0, [0, base + slots), made on
  // the device (no upload, no wait).
  struct BlockOffsets {
    at::Tensor cu_q, cu_k;
    int64_t max_keys;
  };
  static BlockOffsets block_offsets(const DraftContext& context, int64_t slots, int64_t host_keys, const at::Tensor& base);
  // A layer's [q; k; v] of normed rows [n, H] at device positions [n]: k and
  // v into the context's cache there, q returned [n, heads, d].
  at::Tensor block_queries(const DFlashModel& model, DraftContext& context, size_t layer, const at::Tensor& normed,
                           const at::Tensor& positions) const;
  // The rest of a layer for the block: attention, o with the residual x, MLP.
  at::Tensor finish_layer(const DFlashModel& model, DraftContext& context, size_t layer, const at::Tensor& x,
                          const at::Tensor& q, const BlockOffsets& offsets) const;
  // One layer's projections concatenated along their outputs: [q; k; v]
  // (whose [k; v] rows the context's GEMM reads) and [gate; up].
  struct FusedLayer {
    at::Tensor qkv, gate_up;
  };
  void refresh_weights(const DFlashModel& model);
  std::vector<FusedLayer> fused_;
  // The version counters of every source parameter when fused_ was last written.
  std::vector<int64_t> versions_;
};

}  // namespace dflash::drafter
