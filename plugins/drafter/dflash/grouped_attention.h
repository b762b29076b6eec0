// The drafter's attention kernels: one call (cuDNN's fused attention where it
// runs, else SDPA), the additive masks they take, and grouped attention whose
// backward keeps only the layer's q, k and v rows.
#pragma once

#include "row_gather.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace dflash::drafter {

// What grouped attention keeps for backward (drafter.attention_keeps): the
// layer's q/k/v rows (attention_keeping_rows) or every call's gathered q, k
// and v (attention_keeping_calls). kAuto keeps rows where cuDNN's attention
// runs (its backward, called by hand, takes the kept output and log-sum-exp:
// nothing is computed twice) and calls elsewhere (there keeping rows runs
// each call's forward again in backward). The model and the planner both
// decide by keeps_rows.
enum class AttentionKeeps { kAuto, kRows, kCalls };
AttentionKeeps attention_keeps_named(const std::string& name);  // "auto", "rows" or "calls"
inline bool keeps_rows(AttentionKeeps keeps, bool cudnn) {
  return keeps == AttentionKeeps::kRows || (keeps == AttentionKeeps::kAuto && cudnn);
}

// The attention call. q [N, heads, n, d], k and v [N, kv, m, d], bias
// additive, broadcast over heads. cuDNN's fused attention (CUDA, LibTorch ≥
// 2.5) takes the bias and GQA natively and has a faster backward than the
// memory-efficient kernel; SDPA (any device) gets k and v repeated to every
// query head, as its kernels take equal head counts.
at::Tensor attend(const at::Tensor& q, at::Tensor k, at::Tensor v, const at::Tensor& bias, int64_t heads, int64_t kv_heads,
                  bool cudnn);

// An additive mask (0 where allowed, −inf elsewhere) whose rows are padded to
// a multiple of 16 elements, returned as the unpadded view: the fused kernels
// want the bias's row stride aligned (SDPA otherwise copies it per call).
at::Tensor additive_mask(const at::Tensor& allowed, const at::TensorOptions& options);

// Whether cuDNN's attention runs here and agrees with SDPA, forward and
// backward, on a small GQA problem with a ragged mask: through autograd
// (cudnn_attention_works), and with its backward called by hand as
// attention_keeping_rows calls it (cudnn_attention_backward_by_hand_works,
// checked only when first asked). Each asked once per process.
bool cudnn_attention_works(const at::TensorOptions& options, int64_t heads, int64_t kv_heads, int64_t head_dim);
bool cudnn_attention_backward_by_hand_works(const at::TensorOptions& options, int64_t heads, int64_t kv_heads,
                                            int64_t head_dim);

// One grouped attention call: `count` groups of one shape, each with
// `queries` query rows and `keys` key rows, gathered by index from the
// layer's rows; bias [count, 1, queries, keys]. Where the call's rows are a
// few contiguous runs, query_ranges and key_ranges list them, in the index's
// order (empty: by index): attention_keeping_rows then takes slices and
// adds into slices, where index_select and index_add_ (atomics) are slower.
struct AttentionCall {
  int64_t count = 0, queries = 0, keys = 0;
  at::Tensor query_index, key_index, bias;
  std::vector<RowRange> query_ranges, key_ranges;
};

// Every call's output [count, heads, queries, d] (laid out as attend's),
// through attend under autograd: each call's q, k and v gathered from the
// rows at once (row_gather.h) and kept by the kernel for backward.
std::vector<at::Tensor> attention_keeping_calls(const at::Tensor& q_rows, const at::Tensor& k_rows, const at::Tensor& v_rows,
                                                const std::vector<AttentionCall>& calls, int64_t heads, int64_t kv_heads,
                                                bool cudnn);

// The same outputs as attention_keeping_calls, as one autograd node that keeps for backward only the layer's rows (q [R_q,
// heads, d], k and v [R_k, kv, d]) and each call's output and log-sum-exp.
// Autograd through attend keeps every call's gathered q, k and v instead:
// the context rows once per group. Backward gathers each call's q, k and v
// again and runs cuDNN's attention backward on them, with the arguments
// ATen's own autograd passes; off cuDNN it runs the call again under
// autograd. Gradients go back into the rows as row_gather.h's do.
std::vector<at::Tensor> attention_keeping_rows(const at::Tensor& q_rows, const at::Tensor& k_rows, const at::Tensor& v_rows,
                                               const std::vector<AttentionCall>& calls, int64_t heads, int64_t kv_heads,
                                               bool cudnn);

// Block attention (drafter.attention "blocks"; block_layout.h's
// block_kernel_layout): each prefix call through cuDNN's attention without a
// mask, then the block kernel over every entry's remaining keys, merging the
// prefix's output by log-sum-exp. Returns the output rows [R_q, heads, d] in
// q's row order. One autograd node keeping the q/k/v rows, the merged output
// and its log-sum-exp: backward runs the kernel's backward, then each prefix
// call's cuDNN backward given the merged output and log-sum-exp (the
// gradients through its keys), added in. prefixes: CPU int64 [n, 4]
// (PrefixCall's fields); blocks and tiles: block_attention.h's tables on the
// device. The GPU's parts run where kernel_ops::block_attention_fits the
// rows (and LibTorch has cuDNN's attention; the caller checks
// cudnn_attention_backward_by_hand_works); elsewhere (the CPU) both parts
// run by an ATen reference with the same composition (the prefixes' and the
// entries' gradients each from the merged output and log-sum-exp), entry by
// entry: exact and slow, the tests' path.
at::Tensor prefix_block_attention(const at::Tensor& q_rows, const at::Tensor& k_rows, const at::Tensor& v_rows,
                                  const at::Tensor& prefixes, const at::Tensor& blocks, const at::Tensor& tiles);

}  // namespace dflash::drafter
