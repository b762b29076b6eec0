#include "fast_path.h"

#include <dflash/sdk/torch_compat.hpp>
#include <kernel_ops.h>

#include <stdexcept>

#if DFLASH_CUDA_KERNELS
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <vector>
#endif

namespace dflash::target::fast_path {

bool available() { return kernel_ops::available(); }

bool supports(const at::Tensor& like, int64_t head_dim) {
  return kernel_ops::runs_on(like) && head_dim <= 256 && head_dim % 2 == 0;
}

#if DFLASH_CUDA_KERNELS

namespace {
// Both attention kernels take head dims in multiples of 8; zero columns
// change no dot product, and the scale stays that of the true head_dim.
int64_t padded_head_dim(int64_t head_dim) { return (head_dim + 7) / 8 * 8; }
at::Tensor pad_head_dim(const at::Tensor& t) {
  const int64_t head_dim = t.size(-1), padded = padded_head_dim(head_dim);
  return padded == head_dim ? t : at::constant_pad_nd(t, {0, padded - head_dim}, 0);
}
}  // namespace

at::Tensor row_causal_attention_cudnn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t rows) {
  const int64_t tokens = q.size(0), heads = q.size(1), kv_heads = k.size(1), head_dim = q.size(2);
  const int64_t s = tokens / rows;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  // [rows, heads, S, d] views of the token-major tensors; cuDNN takes the strides.
  auto as_bhsd = [&](const at::Tensor& t, int64_t h) { return pad_head_dim(t).view({rows, s, h, -1}).transpose(1, 2); };
  auto result = at::_scaled_dot_product_cudnn_attention(as_bhsd(q, heads), as_bhsd(k, kv_heads), as_bhsd(v, kv_heads),
                                                        /*attn_bias=*/{}, /*compute_log_sumexp=*/false,
                                                        /*dropout_p=*/0.0, /*is_causal=*/true,
                                                        /*return_debug_mask=*/false, scale);
  at::Tensor out = std::get<0>(result).transpose(1, 2);  // [rows, S, heads, padded]
  if (out.size(-1) != head_dim) out = out.narrow(-1, 0, head_dim);
  return out.reshape({tokens, heads * head_dim});
}

bool cudnn_attention_works(const at::Tensor& like, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  try {
    const c10::cuda::CUDAGuard guard(like.device());
    const auto options = like.options();
    const at::Tensor q = at::randn({2 * 16, heads, head_dim}, options), k = at::randn({2 * 16, kv_heads, head_dim}, options);
    const at::Tensor out = row_causal_attention_cudnn(q, k, k, 2);
    return out.isfinite().all().item<bool>();
  } catch (const std::exception&) {
    return false;
  }
}

at::Tensor document_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& cu_seqlens, int64_t max_length) {
  const int64_t head_dim = q.size(-1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const int64_t padded = padded_head_dim(head_dim);
  auto pad = pad_head_dim;
  auto result = at::_flash_attention_forward(pad(q), pad(k), pad(v), cu_seqlens, cu_seqlens, max_length, max_length,
                                             /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false, scale);
  at::Tensor out = std::get<0>(result);
  return padded == head_dim ? out : out.narrow(-1, 0, head_dim).contiguous();
}

bool decode_attention_supported(int64_t head_dim) {
#if DFLASH_TORCH_AT_LEAST(2, 5)
  return head_dim % 8 == 0 && head_dim <= 256;
#else
  (void)head_dim;
  return false;
#endif
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& cu_q,
                            const at::Tensor& cu_k, const at::Tensor& seqused_k, int64_t n, int64_t capacity) {
#if DFLASH_TORCH_AT_LEAST(2, 5)
  const int64_t tokens = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  // Causal with fewer queries than keys: flash attention aligns the mask to
  // the bottom right, so query t of a session sees its keys [0, length − n + t].
  auto result = at::_flash_attention_forward(q, keys, values, cu_q, cu_k, /*max_q=*/n, /*max_k=*/capacity,
                                             /*dropout_p=*/0.0, /*is_causal=*/n > 1, /*return_debug_mask=*/false, scale,
                                             /*window_size_left=*/std::nullopt, /*window_size_right=*/std::nullopt,
                                             /*seqused_k=*/seqused_k);
  return std::get<0>(result).reshape({tokens, heads * head_dim});
#else
  (void)q, (void)keys, (void)values, (void)cu_q, (void)cu_k, (void)seqused_k, (void)n, (void)capacity;
  throw std::logic_error("hf_decoder: decode_attention needs LibTorch >= 2.5");
#endif
}

namespace {
// The forward's side streams, taken from LibTorch's pool once per device and
// kept: cuBLAS gets a workspace per stream it runs on (32 MiB on Hopper,
// allocated on first use and never freed), so fresh pool streams every
// forward grew the allocated memory by one workspace per group and step until
// the pool's 32 streams came round (measured on an H100, 2026-12-06: +64 MiB
// a training step). The memory planner counts these (fact forward_streams).
std::vector<c10::cuda::CUDAStream> side_streams(c10::DeviceIndex device, int64_t count) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, std::vector<c10::cuda::CUDAStream>> kept;
  const std::lock_guard<std::mutex> lock(mutex);
  std::vector<c10::cuda::CUDAStream>& streams = kept[device];
  while (static_cast<int64_t>(streams.size()) < count)
    streams.push_back(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device));
  return {streams.begin(), streams.begin() + count};
}
}  // namespace

void interleave_on_streams(const c10::Device& device, int64_t groups, int64_t steps,
                           const std::function<void(int64_t, int64_t)>& body) {
  if (groups <= 1) {
    for (int64_t step = 0; step < steps; ++step) body(0, step);
    return;
  }
  const c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
  at::cuda::CUDAEvent ready;
  ready.record(caller);
  const std::vector<c10::cuda::CUDAStream> streams = side_streams(device.index(), groups);
  for (const auto& stream : streams) ready.block(stream);
  auto join = [&] {
    for (const auto& stream : streams) {
      at::cuda::CUDAEvent done;
      done.record(stream);
      done.block(caller);
    }
  };
  try {
    for (int64_t step = 0; step < steps; ++step)
      for (int64_t g = 0; g < groups; ++g) {
        const c10::cuda::CUDAStreamGuard on(streams[g]);
        body(g, step);
      }
  } catch (...) {
    join();
    throw;
  }
  join();
}

#else  // no CUDA kernels in this build

namespace {
[[noreturn]] void unavailable() { throw std::logic_error("hf_decoder: this build has no CUDA kernels"); }
}  // namespace

at::Tensor document_causal_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     int64_t) {
  unavailable();
}
void interleave_on_streams(const c10::Device&, int64_t, int64_t, const std::function<void(int64_t, int64_t)>&) {
  unavailable();
}
at::Tensor row_causal_attention_cudnn(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t) { unavailable(); }
at::Tensor decode_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, int64_t, int64_t) {
  unavailable();
}
bool decode_attention_supported(int64_t) { return false; }
bool cudnn_attention_works(const at::Tensor&, int64_t, int64_t, int64_t) { return false; }

#endif

}  // namespace dflash::target::fast_path
