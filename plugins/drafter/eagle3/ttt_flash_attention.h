#pragma once
// The training-time-test attention of ttt_attention.h on flash attention, for
// CUDA bf16/fp16 (LibTorch >= 2.5): step 0's causal part is one varlen flash
// call (each document its own sequence, GQA native), the own-position keys of
// steps 1 … k are k dot products per query, and the two are merged by their
// log-sum-exps. The backward hands flash attention's backward the merged
// output and log-sum-exp — what ring attention does with its blocks: flash
// then forms the joint softmax's probabilities and its D = rowsum(dO ⊙ O)
// itself — and forms the own-position gradients alongside. Nothing of size
// S × S exists in either pass.
#include <ATen/core/Tensor.h>
#include <ATen/core/ATen_fwd.h>

#include <cstdint>

namespace dflash::eagle3 {

// Each document of a [B, S] batch as one varlen sequence, rows one after
// another: cu_seqlens [n + 1] int32 on `device`, the longest length, and for
// each token its sequence and its offset in it (int64 on `device`), which
// flash attention's padded log-sum-exp layout needs. Built from documents on
// the host (no device sync).
struct TttSequences {
  at::Tensor cu_seqlens, token_sequence, token_offset;
  int64_t max_length = 0;
};
TttSequences ttt_sequences(const at::Tensor& documents, const c10::Device& device);

// Whether the flash path takes activations like `like` (CUDA, bf16/fp16)
// with this head_dim (a multiple of 8 up to 256), on a LibTorch that has the
// varlen kernels.
bool ttt_flash_attention_available(const at::Tensor& like, int64_t head_dim);

// As ttt_attention (same shapes and rule), by flash attention; documents
// come as `sequences`. Differentiable in q, key0, value0 and the own keys and values.
at::Tensor ttt_flash_attention(const at::Tensor& q, const at::Tensor& key0, const at::Tensor& value0, at::TensorList own_keys,
                               at::TensorList own_values, const TttSequences& sequences, double scale);

}  // namespace dflash::eagle3
