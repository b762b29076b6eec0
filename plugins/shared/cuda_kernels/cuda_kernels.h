// CUDA kernels of the Qwen3-style layers that the hf_decoder target and the
// dflash drafter's decoding run: the bandwidth-bound steps between the GEMMs
// (RMSNorm; q/k norm + rotary embedding; SwiGLU), each one pass over its
// tensor instead of the 4–8 ATen passes (and fp32 temporaries) of the
// reference paths. The GEMMs stay cuBLAS, attention is flash attention.
//
// Each kernel reproduces Hugging Face's rounding points (normalise in fp32,
// round to the activation dtype, then multiply by the weight and round again;
// cos/sin rounded to the activation dtype before use) so bf16 results stay as
// close to transformers' as its own kernels are.
//
// Free of LibTorch types so nvcc never compiles LibTorch headers; the tensor
// wrappers are kernel_ops.h.
#pragma once

#include "attention_tiling.h"

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dflash::cuda_kernels {

enum class Element { kBFloat16, kFloat16 };

// out[r, :] = weight ⊙ round(x[r, :] · rsqrt(mean(x[r, :]²) + eps)), rows × width, contiguous.
// rstd (optional, fp32 [rows]) receives each row's rsqrt(mean(x²) + eps), for the backward.
void rms_norm(Element element, const void* x, const void* weight, void* out, int64_t rows, int64_t width, float eps,
              cudaStream_t stream, float* rstd = nullptr);

// From the fused projection qkv [tokens, (heads + 2·kv_heads)·head_dim] (q, then k, then v):
// q [tokens, heads, head_dim] and k with the optional per-head RMSNorm (q_norm / k_norm may be
// null) and then the rotary embedding (cos/sin: fp32 [positions, head_dim/2]; token t takes row
// positions[t], or row t where positions is null); v copied as is. k and v go to rows slots[t] of
// [rows, kv_heads, head_dim] buffers (a KV cache; row t where slots is null). positions and slots
// are int64 on the device. heads may be 0 (a [k; v] projection: q and q_norm are then never touched);
// kv_heads may be 0 (any [tokens, heads, head_dim] tensor as "q": training's separate q and k).
// rstd (optional, fp32 [tokens, heads + 2·kv_heads]) receives each normalised vector's
// rsqrt(mean(x²) + eps), for the backward (v's entries are left as they are).
void qk_norm_rope(Element element, const void* qkv, const void* q_norm, const void* k_norm, const float* cos,
                  const float* sin, const int64_t* positions, const int64_t* slots, void* q, void* k, void* v,
                  int64_t tokens, int64_t heads, int64_t kv_heads, int64_t head_dim, float eps, cudaStream_t stream,
                  float* rstd = nullptr);

// ---- Backward kernels (training: the dflash drafter's layers) ----------------
// Each treats the forward's roundings to the activation dtype as identity, as
// autograd through transformers' bf16 arithmetic does, and accumulates in fp32.

// rms_norm's backward from its saved input x, weight and rstd (fp32 [rows]):
// dx[r, :] = rstd·(g − x̂·mean(g ⊙ x̂)), g = dy ⊙ weight, x̂ = x·rstd; and the
// weight's gradient as fp32 partial sums weight_partial [chunks, width]
// (Σ over each chunk's rows of dy ⊙ round(x̂); chunks = rms_norm_weight_chunks(rows, width)).
void rms_norm_backward(Element element, const void* dy, const void* x, const void* weight, const float* rstd, void* dx,
                       float* weight_partial, int64_t rows, int64_t width, cudaStream_t stream);
int64_t rms_norm_weight_chunks(int64_t rows, int64_t width);

// head_norm_rope's backward: the forward is qk_norm_rope with kv_heads 0 on x
// [tokens, heads, head_dim] (norm weight [head_dim], tables fp32 [tokens,
// head_dim/2], row t for token t). From dout, x, weight and rstd (fp32
// [tokens·heads]): dx, and the gradient at the norm's output dn (T, [tokens,
// heads, head_dim]), from which rms_norm_weight_grad gives the weight's.
void head_norm_rope_backward(Element element, const void* dout, const void* x, const void* weight, const float* rstd,
                             const float* cos, const float* sin, void* dx, void* dn, int64_t tokens, int64_t heads,
                             int64_t head_dim, cudaStream_t stream);
// weight_partial [chunks, width] = Σ over each chunk's rows of dy ⊙ round(x·rstd)
// (the second half of rms_norm_backward, alone).
void rms_norm_weight_grad(Element element, const void* dy, const void* x, const float* rstd, float* weight_partial,
                          int64_t rows, int64_t width, cudaStream_t stream);

// swiglu's backward: from gate_up [rows, 2·width] and d_out [rows, width],
// d_gate_up [rows, 2·width]: d_up = d_out ⊙ round(silu(gate)), d_gate =
// d_out ⊙ up ⊙ σ(gate)·(1 + gate·(1 − σ(gate))).
void swiglu_backward(Element element, const void* gate_up, const void* d_out, void* d_gate_up, int64_t rows, int64_t width,
                     cudaStream_t stream);

// out[r, j] = round(silu(gate_up[r, j])) · gate_up[r, width + j] for j < width.
void swiglu(Element element, const void* gate_up, void* out, int64_t rows, int64_t width, cudaStream_t stream);

// ---- The Qwen3.5 / Qwen3.6 layers' norms (hybrid_norms.cu) ------------------
// out[r, :] = round(x[r, :] · rsqrt(mean(x[r, :]²) + eps) · scale), formed in
// fp32 and rounded once: the (1 + w) RMSNorm (scale = 1 + w, fp32 [width]).
void rms_norm_scaled(Element element, const void* x, const float* scale, void* out, int64_t rows, int64_t width,
                     float eps, cudaStream_t stream);
// The gated RMSNorm after Gated DeltaNet's delta rule: for row r (token
// r / heads, head r % heads) of x [rows, width] contiguous, with gate row
// gate + (r / heads)·gate_stride + (r % heads)·width:
// out[r, :] = round(round(weight ⊙ round(x̂)) · SiLU(gate)), x̂ and SiLU in fp32.
void gated_rms_norm(Element element, const void* x, const void* gate, const void* weight, void* out, int64_t rows,
                    int64_t heads, int64_t width, int64_t gate_stride, float eps, cudaStream_t stream);
// Gated DeltaNet's causal depthwise conv1d and SiLU (causal_conv.cu): x
// [rows, seq, channels] at the given row and token strides (channels
// contiguous), weight [channels, taps] (taps ≤ 8), prefix [rows, taps − 1,
// channels] (the inputs before each row; null: zeros), in_document int32
// [rows, seq] (each token's index in its document; taps before it read
// nothing; null: no document starts in the rows) → out [rows, seq,
// channels] contiguous = round(SiLU(round(Σ taps in fp32))).
void causal_conv_silu(Element element, const void* x, int64_t row_stride, int64_t token_stride, const void* weight,
                      const void* prefix, const int32_t* in_document, void* out, int64_t rows, int64_t seq,
                      int64_t channels, int64_t taps, cudaStream_t stream);

// Row-invariant kernels of exact decoding (hf_decoder's `exact_decoding`):
// each output row is computed by the same instructions in the same order
// whatever the number of rows in the call, so a token's result in a
// verification block of up to kInvariantMaxRows tokens is bitwise its result
// when it is decoded alone. cuBLAS and flash attention pick different kernels
// (and split their sums differently) for 1 and 16 rows; these do not.
constexpr int64_t kInvariantMaxRows = 16;

// out[r, j] = round(Σ_k x[r, k]·weight[j, k] + bias[j] + residual[r, j]) for
// r < rows, j < out_features: summed in fp32 on the tensor cores (fixed
// 16-row tiles; k in 32-wide chunks, the chunks in invariant_linear_splits
// consecutive runs, each run's sum in chunk order, the runs added in order),
// rounded once. The split depends on the weight's shape only, so a row's
// result depends on nothing but its own row, at any row count.
// bias and residual may be null; out may be residual (in place). x and weight
// 16-byte aligned (they are read 8 elements at a time; bias, residual and out
// one at a time) and in_features a multiple of 8 (invariant_linear_fits).
// workspace: invariant_linear_workspace_floats(rows, out, in) fp32 values
// (the runs' partial sums; null where that is 0), not read before the call.
void invariant_linear(Element element, const void* x, const void* weight, const void* bias, const void* residual, void* out,
                      float* workspace, int64_t rows, int64_t out_features, int64_t in_features, cudaStream_t stream);
// The runs of k's 32-wide chunks a weight [out_features, in_features] is summed in.
int64_t invariant_linear_splits(int64_t out_features, int64_t in_features);
int64_t invariant_linear_workspace_floats(int64_t rows, int64_t out_features, int64_t in_features);
bool invariant_linear_fits(int64_t rows, int64_t in_features, const void* x, const void* weight);
// The current device's compute capability, major · 10 + minor.
int current_compute_capability();
// Whether invariant_linear runs the warpgroup-MMA products on the current
// device (a build for sm_90a on a compute-capability 9.0 GPU), else mma.sync.
bool invariant_linear_runs_wgmma();
// Whether a call of this shape adds its runs of k in a cluster of their
// blocks' shared memory (the warpgroup products, several runs, no more than
// set_invariant_linear_most_cluster_runs allows, a device that holds such a
// cluster), else through the workspace and a second kernel.
bool invariant_linear_adds_runs_in_cluster(Element element, int64_t rows, int64_t out_features, int64_t in_features);
// The most runs of k a cluster adds, for the process: 1 (the default) lets
// the workspace add every call's runs, which was faster on an H100; up to
// 16. Benchmarks time the two ways, tests check that they give the same
// bits. Throws outside 1 to 16.
void set_invariant_linear_most_cluster_runs(int most);
// Warpgroups a block of the warpgroup products has, for the process: 2 (the
// default; 128 features a block) or 4 (256 features, for blocks of up to 80
// rows; more rows keep 2), which reads each row of x half as often. Never a
// row's bits; benchmarks time both. Throws for other counts.
void set_invariant_linear_warpgroups(int warpgroups);
// Whether the kernels' code on the current device was compiled with the
// warpgroup MMA (sm_90a); runs a one-thread kernel and waits for it.
bool invariant_linear_device_code_has_wgmma();

// Decoding attention over the pooled KV caches, each query by itself: token i
// (session i / n, its query i % n of n) attends to keys [0, seqused_k[s] − n + i % n]
// of its session, which start at row cu_k[s] of keys/values [·, kv_heads, head_dim].
// q [tokens, heads, head_dim] contiguous → out [tokens, heads·head_dim]. A
// query's arithmetic depends only on its own key count, never on n or tokens
// (nor on how many queries a block takes: up to 4 query heads sharing a KV
// head and up to 8 queries of one session's step, which read the rows they
// all see once for all of them).
// max_keys bounds every session's length (its pool row capacity).
// A draft tree in one session's step (null rows: a chain): node i attends
// to the session's keys before the step, then to rows[i·stride + j],
// j < lengths[i] — the session rows of its path from the root, itself last.
struct DecodeTree {
  const int32_t* rows = nullptr;
  const int32_t* lengths = nullptr;
  int64_t stride = 0;
};
void invariant_decode_attention(Element element, const void* q, const void* keys, const void* values, const int32_t* cu_k,
                                const int32_t* seqused_k, const DecodeTree& tree, void* out, int64_t tokens, int64_t n,
                                int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_keys, cudaStream_t stream,
                                const AttentionTiling& tiling = {});
// Whether invariant_decode_attention takes this head_dim (a multiple of 8,
// ≤ 256) and a session of max_keys keys (their scores fit in shared memory).
bool invariant_decode_attention_fits(int64_t head_dim, int64_t max_keys);

// A draft tree's accepted path kept in place in several caches at once (each
// layer's keys and values): in every buffer, row to_start + j ← row from[j]
// for j = 0 … moves − 1, rows of row_bytes bytes. The sources must increase
// and never fall below their destinations (from[j] ≥ to_start + j), as a
// path's nodes, stored parents first, do; kernel_ops checks it. The moves
// travel in the launch's arguments: no upload, nothing to wait for.
constexpr int32_t kMaxCacheRowBuffers = 64;
constexpr int32_t kMaxCacheRowMoves = 256;
struct CacheRowMoves {
  void* buffers[kMaxCacheRowBuffers] = {};
  int64_t from[kMaxCacheRowMoves] = {};
  int64_t to_start = 0, row_bytes = 0;
  int32_t buffers_used = 0, moves = 0;
};
void move_cache_rows(const CacheRowMoves& moves, cudaStream_t stream);

}  // namespace dflash::cuda_kernels
