// loss/fused_ckpt_kl: the CE + KL blend of loss/kl, with its gradient in
// closed form, on the SDK's chunked-loss toolkit (the toolkit chunks the
// rows, forms the logits, reduces and keeps only dL/dh; this file is the
// chunk's mathematics). For the rows of a chunk, with student logits
// z = h·Wᵀ and teacher logits u = h_t·Wᵀ (no grad):
//   ∂(c·ℓ)/∂z = c·[(1 − α)·(softmax(z) − onehot(y)) + α·T·(softmax(z/T) − softmax(u/T))]
// (c: the row's reduction coefficient). On CUDA in fp32 / bf16 / fp16 two
// kernel passes compute it over the logits in their input dtype and write it
// over them in place, so a chunk holds only z (and u); elsewhere the
// blend's LibTorch closed form (loss_support, shared with ce and kl) runs in
// the math dtype.
#include "loss_support.h"

#ifdef DFLASH_FUSED_CUDA
#include "fused_kernels.h"

#include <c10/cuda/CUDAStream.h>
#endif

namespace {
using namespace dflash;

// Whether this build has the CUDA kernels.
#ifdef DFLASH_FUSED_CUDA
constexpr bool kCudaKernels = true;
#else
constexpr bool kCudaKernels = false;
#endif

// Whether a chunk of `h` runs the CUDA kernels (else the LibTorch path).
bool cuda_path_applies(const at::Tensor& h) {
  const auto t = h.scalar_type();
  return kCudaKernels && h.is_cuda() && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf);
}

#ifdef DFLASH_FUSED_CUDA

// The GPU path: two passes over the chunk's input-dtype logits
// (row_statistics, gradient_and_kl); the second writes ∂(c·ℓ)/∂z over z in
// place. Both passes in one launch were slower in the two forms measured
// (docs/performance.md, "Issue 20's loss targets").
sdk::ChunkRows cuda_chunk(const sdk::LossChunk& c, const loss::BlendSettings& s) {
  const at::Tensor& z = c.logits;
  const at::Tensor& u = c.teacher_logits;
  const auto element = z.scalar_type() == at::kBFloat16 ? fused::Element::kBFloat16
                       : z.scalar_type() == at::kHalf    ? fused::Element::kFloat16
                                                         : fused::Element::kFloat32;
  const int64_t rows = z.size(0), vocab = z.size(1);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(z.device().index()).stream();
  const auto f32 = z.options().dtype(at::kFloat);
  at::Tensor lse_z = at::empty({rows}, f32), z_target = at::empty({rows}, f32);
  at::Tensor argmax = at::empty({rows}, z.options().dtype(at::kLong));
  at::Tensor kl = u.defined() ? at::empty({rows}, f32) : at::Tensor();
  const at::Tensor y = c.targets.contiguous();
  const at::Tensor coefficient = c.coefficient.to(at::kFloat).contiguous();
  const float inv_t = static_cast<float>(1.0 / s.temperature);
  const auto ce_scale = static_cast<float>(1.0 - s.kl_weight);
  const auto kl_scale = static_cast<float>(s.kl_weight * s.temperature);
  at::Tensor lse_zt = at::empty({rows}, f32), lse_ut = at::empty({rows}, f32);
  // Neither pass reads a row the loss ignores (zeros written for it).
  const at::Tensor valid = c.valid.contiguous();
  const bool* valid_rows = valid.data_ptr<bool>();
  fused::row_statistics(element, z.data_ptr(), u.defined() ? u.data_ptr() : nullptr, rows, vocab,
                        y.data_ptr<int64_t>(), valid_rows, inv_t, lse_z.data_ptr<float>(), lse_zt.data_ptr<float>(),
                        lse_ut.data_ptr<float>(), z_target.data_ptr<float>(), argmax.data_ptr<int64_t>(), stream);
  if (c.need_grad || u.defined())
    fused::gradient_and_kl(element, z.data_ptr(), u.defined() ? u.data_ptr() : nullptr, rows, vocab,
                           y.data_ptr<int64_t>(), valid_rows, coefficient.data_ptr<float>(), ce_scale, kl_scale, inv_t,
                           lse_z.data_ptr<float>(), lse_zt.data_ptr<float>(), lse_ut.data_ptr<float>(),
                           kl.defined() ? kl.data_ptr<float>() : nullptr, c.need_grad, stream);
  sdk::ChunkRows out = loss::blend_rows(s, lse_z - z_target, kl);
  if (c.need_grad) out.grad = z;  // now ∂(c·ℓ)/∂z
  out.correct = argmax.eq(c.targets);
  return out;
}
#endif

class FusedCheckpointedKl : public sdk::ChunkedLoss<FusedCheckpointedKl> {
 public:
  static constexpr sdk::PluginInfo info{
      "fused_ckpt_kl", "1.1.0",
      "CE + KL blend in row chunks, closed-form gradient (CUDA kernels): only dh [N, H] is kept for backward"};
  static constexpr bool reports_correct = true;  // from the kernels' argmax: no extra pass over the logits

  static std::string config_schema() {
    sdk::Schema schema = sdk::chunked_loss_schema();
    loss::add_distillation(schema, 1.0);
    return schema.dump();
  }
  explicit FusedCheckpointedKl(const sdk::CreateContext& context)
      : ChunkedLoss(context, loss::BlendSettings::read(context.config()).teacher(sdk::Teacher::kHidden)),
        s_(loss::BlendSettings::read(context.config())),
        on_gpu_(context.device().rfind("cuda", 0) == 0) {}

  sdk::ChunkRows rows_and_grad(const sdk::LossChunk& chunk) const {
#ifdef DFLASH_FUSED_CUDA
    if (cuda_path_applies(chunk.logits))
      return cuda_chunk(chunk, s_);
#endif
    return loss::blend_rows_and_grad(chunk, s_);
  }

  // The kernels read and write the logits in the input dtype.
  bool logits_in_input_dtype(const at::Tensor& hidden) const { return cuda_path_applies(hidden); }

  // Bytes alive per logit: the GPU path keeps z (and u) in the input dtype;
  // the reference path about 8 math-dtype buffers (measured on CPU).
  double logit_bytes(const sdk::LossShape& shape) const {
    const bool teacher = this->teacher() == sdk::Teacher::kHidden;
    if (kCudaKernels && on_gpu_ && shape.element_bytes <= 4) return shape.element_bytes * (teacher ? 2.0 : 1.0);
    return loss::math_buffers(shape, 9);
  }

 private:
  loss::BlendSettings s_;
  bool on_gpu_;
};

}  // namespace

DFLASH_PLUGINS(FusedCheckpointedKl)
