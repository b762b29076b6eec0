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

// The same for grouped-query attention: key and value [.., kv_heads, S, d]
// with fewer heads than the query [.., heads, S, d], each serving
// heads / kv_heads consecutive query heads. 2.5+ passes enable_gqa (no copy
// of K and V); before, K and V are repeated per query head.
inline at::Tensor grouped_query_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                          const c10::optional<at::Tensor>& attn_mask, bool is_causal) {
  const int64_t group = query.size(-3) / key.size(-3);
  if (group == 1) return scaled_dot_product_attention(query, key, value, attn_mask, is_causal);
#if DFLASH_TORCH_AT_LEAST(2, 5)
  return at::scaled_dot_product_attention(query, key, value, attn_mask, 0.0, is_causal, c10::nullopt,
                                          /*enable_gqa=*/true);
#else
  return scaled_dot_product_attention(query, key.repeat_interleave(group, -3), value.repeat_interleave(group, -3),
                                      attn_mask, is_causal);
#endif
}

}  // namespace dflash::compat
