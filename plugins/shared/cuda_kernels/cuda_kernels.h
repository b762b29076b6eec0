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

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dflash::cuda_kernels {

enum class Element { kBFloat16, kFloat16 };

// out[r, :] = weight ⊙ round(x[r, :] · rsqrt(mean(x[r, :]²) + eps)), rows × width, contiguous.
void rms_norm(Element element, const void* x, const void* weight, void* out, int64_t rows, int64_t width, float eps,
              cudaStream_t stream);

// From the fused projection qkv [tokens, (heads + 2·kv_heads)·head_dim] (q, then k, then v):
// q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] with the optional per-head RMSNorm
// (q_norm / k_norm may be null) and then the rotary embedding (cos/sin: fp32 [tokens, head_dim/2]);
// v [tokens, kv_heads, head_dim] copied as is. heads may be 0 (a [k; v] projection: q and q_norm
// are then never touched).
void qk_norm_rope(Element element, const void* qkv, const void* q_norm, const void* k_norm, const float* cos,
                  const float* sin, void* q, void* k, void* v, int64_t tokens, int64_t heads, int64_t kv_heads,
                  int64_t head_dim, float eps, cudaStream_t stream);

// out[r, j] = round(silu(gate_up[r, j])) · gate_up[r, width + j] for j < width.
void swiglu(Element element, const void* gate_up, void* out, int64_t rows, int64_t width, cudaStream_t stream);

}  // namespace dflash::cuda_kernels
