// dflash/sdk/torch_compat.hpp — every difference between the LibTorch
// versions dflash-host builds against (Debian's 1.13 CPU build and the 2.x
// wheels with CUDA) lives here, and only here.
#pragma once

#include <torch/version.h>

#include <cmath>
#include <stdexcept>

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#if TORCH_VERSION_MAJOR >= 2
#include <ATen/ops/scaled_dot_product_attention.h>
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 5
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/constant_pad_nd.h>
#endif
#else
#include <ATen/ops/_scaled_dot_product_attention.h>
#endif

#define DFLASH_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator: since 2.3 allocate() is non-const and copy_data() must be
// overridden. A custom allocator (e.g. a counting one in tests) writes
//   c10::DataPtr allocate(size_t n) DFLASH_COMPAT_ALLOCATE_QUALIFIER override;
//   DFLASH_COMPAT_ALLOCATOR_COPY_DATA
#if DFLASH_TORCH_AT_LEAST(2, 3)
#define DFLASH_COMPAT_ALLOCATE_QUALIFIER
#define DFLASH_COMPAT_ALLOCATOR_COPY_DATA                                     \
  void copy_data(void* dest, const void* src, std::size_t count) const override { \
    default_copy_data(dest, src, count);                                      \
  }
#else
#define DFLASH_COMPAT_ALLOCATE_QUALIFIER const
#define DFLASH_COMPAT_ALLOCATOR_COPY_DATA
#endif

namespace dflash::compat {

// Fused attention softmax(q·kᵀ/√d + mask)·v. 2.x has the public op (flash /
// memory-efficient kernels on the GPU); 1.13 only the private one, which
// returns (output, weights).
inline at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key,
                                               const at::Tensor& value,
                                               const c10::optional<at::Tensor>& attn_mask, bool is_causal) {
#if DFLASH_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(query, key, value, attn_mask, 0.0, is_causal);
#else
  return std::get<0>(at::_scaled_dot_product_attention(query, key, value, attn_mask, 0.0,
                                                       /*need_attn_weights=*/false, is_causal));
#endif
}

// Flash attention over variable-length sequences (differentiable in q, k, v),
// where LibTorch has it (2.5 and later, CUDA, fp16/bf16; head_dim ≤ 256, which
// the caller checks): q [total_q, heads,
// d], k/v [total_k, kv_heads, d] (GQA native), cu_* int32 offsets. Not
// causal. Head dims are zero-padded to a multiple of 8 (no dot product
// changes; the scale stays 1/√d).
inline bool varlen_attention_available(const at::Tensor& like) {
#if DFLASH_TORCH_AT_LEAST(2, 5)
  return like.is_cuda() && (like.scalar_type() == at::kBFloat16 || like.scalar_type() == at::kHalf);
#else
  (void)like;
  return false;
#endif
}

inline at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t max_q, int64_t max_k) {
#if DFLASH_TORCH_AT_LEAST(2, 5)
  const int64_t d = q.size(-1), padded = (d + 7) / 8 * 8;
  auto pad = [&](const at::Tensor& t) { return padded == d ? t : at::constant_pad_nd(t, {0, padded - d}, 0); };
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  at::Tensor out = std::get<0>(at::_flash_attention_forward(pad(q), pad(k), pad(v), cu_q, cu_k, max_q, max_k, 0.0,
                                                            /*is_causal=*/false, /*return_debug_mask=*/false, scale));
  return padded == d ? out : out.narrow(-1, 0, d);
#else
  (void)q, (void)k, (void)v, (void)cu_q, (void)cu_k, (void)max_q, (void)max_k;
  throw std::logic_error("varlen_attention needs LibTorch 2.5 or later with CUDA");
#endif
}

}  // namespace dflash::compat
