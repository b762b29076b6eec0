#include "kernel_ops.h"

#include <stdexcept>

#if DFLASH_CUDA_KERNELS
#include "cuda_kernels.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dflash::kernel_ops {

#if DFLASH_CUDA_KERNELS
namespace {

cuda_kernels::Element element_of(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? cuda_kernels::Element::kBFloat16 : cuda_kernels::Element::kFloat16;
}
cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
const void* data_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace

bool available() { return true; }

bool runs_on(const at::Tensor& like) {
  return like.is_cuda() && (like.scalar_type() == at::kBFloat16 || like.scalar_type() == at::kHalf);
}

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t width = x.size(-1);
  cuda_kernels::rms_norm(element_of(x), x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() / width, width,
                         static_cast<float>(eps), stream_of(x));
  return out;
}

HeadTensors qk_norm_rope(const at::Tensor& qkv_in, const at::Tensor& q_norm, const at::Tensor& k_norm,
                         const at::Tensor& cos, const at::Tensor& sin, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, double eps) {
  const c10::cuda::CUDAGuard guard(qkv_in.device());
  const at::Tensor qkv = qkv_in.contiguous();
  const int64_t tokens = qkv.size(0);
  HeadTensors out{at::empty({tokens, heads, head_dim}, qkv.options()), at::empty({tokens, kv_heads, head_dim}, qkv.options()),
                  at::empty({tokens, kv_heads, head_dim}, qkv.options())};
  cuda_kernels::qk_norm_rope(element_of(qkv), qkv.data_ptr(), data_or_null(q_norm), data_or_null(k_norm),
                             cos.data_ptr<float>(), sin.data_ptr<float>(), out.q.data_ptr(), out.k.data_ptr(),
                             out.v.data_ptr(), tokens, heads, kv_heads, head_dim, static_cast<float>(eps), stream_of(qkv));
  return out;
}

at::Tensor swiglu(const at::Tensor& gate_up_in) {
  const c10::cuda::CUDAGuard guard(gate_up_in.device());
  const at::Tensor gate_up = gate_up_in.contiguous();
  const int64_t width = gate_up.size(-1) / 2, rows = gate_up.numel() / gate_up.size(-1);
  at::Tensor out = at::empty({rows, width}, gate_up.options());
  cuda_kernels::swiglu(element_of(gate_up), gate_up.data_ptr(), out.data_ptr(), rows, width, stream_of(gate_up));
  return out;
}

#else  // no CUDA kernels in this build

namespace {
[[noreturn]] void unavailable() { throw std::logic_error("dflash: this build has no CUDA kernels"); }
}  // namespace

bool available() { return false; }
bool runs_on(const at::Tensor&) { return false; }
at::Tensor rms_norm(const at::Tensor&, const at::Tensor&, double) { unavailable(); }
HeadTensors qk_norm_rope(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         int64_t, int64_t, int64_t, double) {
  unavailable();
}
at::Tensor swiglu(const at::Tensor&) { unavailable(); }

#endif

}  // namespace dflash::kernel_ops
