// The GPU path of the hf_decoder forward: our CUDA kernels for the steps
// between the GEMMs (kernel_ops.h, shared with the dflash drafter), and flash
// attention over variable-length documents (no [S, S] mask is ever built).
// Compiled only against a CUDA LibTorch; elsewhere available() is false and
// the decoder runs its ATen reference path, which is also what the GPU path
// is tested against.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>

namespace dflash::target::fast_path {

// Whether this build carries the kernels (kernel_ops.h: RMSNorm, q/k norm +
// RoPE, SwiGLU; the attention calls below).
bool available();

// Whether the kernels can run these activations: a CUDA tensor of bf16 or fp16
// and a head_dim flash attention takes (≤ 256).
bool supports(const at::Tensor& like, int64_t head_dim);

// Causal attention within each document of a flattened packed batch:
// cu_seqlens int32 [documents + 1] (offsets into the token dimension),
// max_length the longest document. GQA is native (no repeated K/V).
// Returns [tokens, heads, head_dim].
at::Tensor document_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& cu_seqlens, int64_t max_length);

// Causal attention over rows that are each one document, through cuDNN's
// fused attention (on Hopper far faster than flash attention 2 here; see
// docs/performance.md). q [rows·S, heads, head_dim], k/v [rows·S, kv_heads,
// head_dim]; GQA is native. Returns [rows·S, heads·head_dim].
at::Tensor row_causal_attention_cudnn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t rows);

// Decoding attention straight over the pooled KV caches (decode_sessions.h),
// with no gather and no mask: flash attention over variable-length keys,
// every number it needs in device memory, so a CUDA graph can capture it.
// q [count·n, heads, head_dim]: session i's n new queries at rows [i·n, (i+1)·n).
// keys/values: the pool of one layer flattened to [rows·capacity, kv_heads,
// head_dim]; session i's keys start at cu_k[i] (its row · capacity) and it
// attends to the first seqused_k[i] of them (its length after the step), its
// queries being the last n of those positions (causal, aligned bottom-right).
// cu_q [count + 1] (0, n, 2n, …), cu_k [count + 1] (the last entry is not
// read) and seqused_k [count] are int32 on the device. GQA is native.
// Returns [count·n, heads·head_dim].
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& cu_q,
                            const at::Tensor& cu_k, const at::Tensor& seqused_k, int64_t n, int64_t capacity);

// Whether decode_attention runs here: a build with the kernels, LibTorch ≥
// 2.5 (flash attention's seqused_k), and a head_dim flash attention takes
// without padding (a multiple of 8, ≤ 256; the pool is not padded).
bool decode_attention_supported(int64_t head_dim);

// Whether row_causal_attention_cudnn runs on this device and LibTorch (a tiny
// probe; an unsupported cuDNN throws there, and the caller keeps flash).
bool cudnn_attention_works(const at::Tensor& like, int64_t heads, int64_t kv_heads, int64_t head_dim);

// Calls body(group, step) for every step in [0, steps) and group in
// [0, groups): each group's calls in order on its own CUDA stream, issued step
// by step across groups so one group's memory-bound kernels overlap another's
// GEMMs. Work already queued on the caller's stream comes first, and the
// caller's stream waits for every group before anything queued after (also
// when body throws). One group runs on the caller's stream.
void interleave_on_streams(const c10::Device& device, int64_t groups, int64_t steps,
                           const std::function<void(int64_t group, int64_t step)>& body);

}  // namespace dflash::target::fast_path
