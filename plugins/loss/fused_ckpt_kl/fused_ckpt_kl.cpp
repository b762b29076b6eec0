// loss/fused_ckpt_kl: the CE + KL blend of loss/kl, computed chunk by chunk
// over rows so that no [chunk, V] tensor outlives its chunk and nothing of
// size N×V is kept for backward.
//
// How: the gradient is computed inside the chunk loop, during forward. For
// the rows of a chunk, with student logits z = h·Wᵀ and teacher logits
// u = h_t·Wᵀ (no grad):
//   dℓ/dz = c·[(1 − α)·(softmax(z) − onehot(y)) + α·T·(softmax(z/T) − softmax(u/T))]
// (c: the row's reduction coefficient), so dh = (dℓ/dz)·W and, for a
// trainable lm_head, dW += (dℓ/dz)ᵀ·h. Only dh [N, H] (and dW [V, H]) is
// kept; backward scales them by the upstream gradient. GEMMs per chunk: 2
// for CE only (z, dh), 3 with the teacher (z, u, dh), one more for dW.
// When neither hidden nor the weight needs a gradient, only the loss is
// computed.
#include "loss_support.h"

#include <torch/autograd.h>

#include <algorithm>

#ifdef DFLASH_FUSED_CUDA
#include "fused_kernels.h"

#include <c10/cuda/CUDAStream.h>
#endif

namespace {
using namespace dflash;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Per-row outputs of the chunk loop, for the metrics.
struct RowOutputs {
  at::Tensor ce, kl, correct;
};

// What one chunk produces: per-row CE / KL / top-1 hit, and dℓ/dz [rows, V]
// in the input dtype when a gradient is wanted.
struct ChunkResult {
  at::Tensor ce, kl, correct, grad;
};

struct ChunkArgs {
  at::Tensor h, teacher, weight_t, y, c;  // y: [rows] int64 (safe), c: [rows] math dtype
  double alpha, temperature;
  bool use_teacher, need_grad;
  at::ScalarType math;
};

// The reference path (any device, any float dtype): LibTorch operators.
ChunkResult aten_chunk(const ChunkArgs& a) {
  ChunkResult r;
  const at::Tensor y = a.y.unsqueeze(1), c = a.c.unsqueeze(1);
  const at::Tensor z = at::matmul(a.h, a.weight_t).to(a.math);  // [rows, V]
  const at::Tensor lse = z.logsumexp(1, true);
  r.ce = (lse - z.gather(1, y)).squeeze(1);
  r.correct = z.argmax(1).eq(a.y);
  at::Tensor grad;
  if (a.need_grad && a.alpha < 1.0) {
    grad = (z - lse).exp_().mul_((1.0 - a.alpha) * c);
    grad.scatter_add_(1, y, -(1.0 - a.alpha) * c);
  }
  if (a.use_teacher) {
    const double t = a.temperature;
    const at::Tensor teacher_log_p = at::matmul(a.teacher, a.weight_t).to(a.math).div_(t).log_softmax(1);
    const at::Tensor student_log_q = (t == 1.0 ? z : z / t).log_softmax(1);
    const at::Tensor teacher_p = teacher_log_p.exp();
    r.kl = (teacher_p * (teacher_log_p - student_log_q)).sum(1);
    if (a.need_grad) {
      at::Tensor kl_grad = student_log_q.exp().sub_(teacher_p).mul_((a.alpha * t) * c);
      grad = grad.defined() ? grad.add_(kl_grad) : kl_grad;
    }
  }
  if (a.need_grad) {
    if (!grad.defined()) grad = at::zeros({a.h.size(0), a.weight_t.size(1)}, a.h.options().dtype(a.math));
    r.grad = grad.to(a.h.scalar_type());
  }
  return r;
}

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

// The GPU path: the GEMMs through cuBLAS, the softmax arithmetic in two
// kernel passes that write dℓ/dz over the student logits in place, so a
// chunk holds only z (and u) in the input dtype.
ChunkResult cuda_chunk(const ChunkArgs& a) {
  const auto element = a.h.scalar_type() == at::kBFloat16 ? fused::Element::kBFloat16
                       : a.h.scalar_type() == at::kHalf    ? fused::Element::kFloat16
                                                           : fused::Element::kFloat32;
  const int64_t rows = a.h.size(0), vocab = a.weight_t.size(1);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.h.device().index()).stream();
  at::Tensor z = at::matmul(a.h, a.weight_t).contiguous();
  at::Tensor u = a.use_teacher ? at::matmul(a.teacher, a.weight_t).contiguous() : at::Tensor();
  const auto f32 = a.h.options().dtype(at::kFloat);
  at::Tensor lse_z = at::empty({rows}, f32), lse_zt = at::empty({rows}, f32), lse_ut = at::empty({rows}, f32);
  at::Tensor z_target = at::empty({rows}, f32);
  at::Tensor argmax = at::empty({rows}, a.h.options().dtype(at::kLong));
  const at::Tensor y = a.y.contiguous();
  const at::Tensor c = a.c.to(at::kFloat).contiguous();
  const float inv_t = static_cast<float>(1.0 / a.temperature);
  fused::row_statistics(element, z.data_ptr(), u.defined() ? u.data_ptr() : nullptr, rows, vocab, y.data_ptr<int64_t>(),
                        inv_t, lse_z.data_ptr<float>(), lse_zt.data_ptr<float>(), lse_ut.data_ptr<float>(),
                        z_target.data_ptr<float>(), argmax.data_ptr<int64_t>(), stream);
  ChunkResult r;
  r.ce = (lse_z - z_target).to(a.math);
  r.correct = argmax.eq(a.y);
  at::Tensor kl = a.use_teacher ? at::empty({rows}, f32) : at::Tensor();
  if (a.need_grad || a.use_teacher)
    fused::gradient_and_kl(element, z.data_ptr(), u.defined() ? u.data_ptr() : nullptr, rows, vocab,
                           y.data_ptr<int64_t>(), c.data_ptr<float>(), static_cast<float>(1.0 - a.alpha),
                           static_cast<float>(a.alpha * a.temperature), inv_t, lse_z.data_ptr<float>(),
                           lse_zt.data_ptr<float>(), lse_ut.data_ptr<float>(), kl.defined() ? kl.data_ptr<float>() : nullptr,
                           a.need_grad, stream);
  if (kl.defined()) r.kl = kl.to(a.math);
  if (a.need_grad) r.grad = z;  // now dℓ/dz
  return r;
}
#endif

ChunkResult compute_chunk(const ChunkArgs& a) {
#ifdef DFLASH_FUSED_CUDA
  if (cuda_path_applies(a.h)) return cuda_chunk(a);
#endif
  return aten_chunk(a);
}

// [chunk, V] bytes per row of V alive at once: the reference path keeps about
// six math-dtype buffers; the GPU path keeps z (and u) in the input dtype.
double workspace_bytes_per_element(bool gpu_path, int32_t element_bytes, bool teacher) {
  if (gpu_path) return element_bytes * (teacher ? 2.0 : 1.0);
  return 6.0 * static_cast<double>(loss::math_bytes(element_bytes));
}

// An automatic chunk never exceeds this many rows: the GEMMs of a chunk are
// already near their peak at M = 1024 (measured on an H200, docs/performance.md),
// while memory keeps growing with the chunk.
constexpr int64_t kAutoChunkRowsCap = 1024;

int64_t chunk_rows(const loss::LossSettings& s, int64_t n, int64_t v, double bytes_per_element) {
  int64_t rows = s.chunk_size;
  if (rows <= 0) {
    const double budget = s.chunk_memory_mb * 1024.0 * 1024.0;
    rows = std::min(kAutoChunkRowsCap, static_cast<int64_t>(budget / (static_cast<double>(v) * bytes_per_element)));
    if (rows >= 128) rows -= rows % 128;  // whole tiles for the GEMMs
  }
  return std::clamp<int64_t>(rows, 1, std::max<int64_t>(n, 1));
}

class ChunkedBlend : public torch::autograd::Function<ChunkedBlend> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& teacher_hidden, const at::Tensor& coefficient,
                            const at::Tensor& targets, bool use_teacher, double alpha, double temperature,
                            int64_t chunk, RowOutputs* rows_out) {
    const auto math = loss::math_dtype(hidden.scalar_type());
    const int64_t n = hidden.size(0);
    const bool need_dh = hidden.requires_grad();
    const bool need_dw = weight.requires_grad();

    at::Tensor dh = need_dh ? at::empty_like(hidden, at::MemoryFormat::Contiguous) : at::Tensor();
    at::Tensor dw = need_dw ? at::zeros(weight.sizes(), weight.options().dtype(math)) : at::Tensor();
    at::Tensor total = at::zeros({}, hidden.options().dtype(math));
    rows_out->ce = at::empty({n}, hidden.options().dtype(math));
    rows_out->correct = at::empty({n}, hidden.options().dtype(at::kBool));
    if (use_teacher) rows_out->kl = at::empty({n}, hidden.options().dtype(math));

    ChunkArgs a;
    a.weight_t = weight.t();
    a.alpha = alpha;
    a.temperature = temperature;
    a.use_teacher = use_teacher;
    a.need_grad = need_dh || need_dw;
    a.math = math;
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t rows = std::min(chunk, n - start);
      a.h = hidden.narrow(0, start, rows);
      a.teacher = use_teacher ? teacher_hidden.narrow(0, start, rows) : at::Tensor();
      a.y = targets.narrow(0, start, rows);
      a.c = coefficient.narrow(0, start, rows);
      const ChunkResult r = compute_chunk(a);
      rows_out->ce.narrow(0, start, rows).copy_(r.ce);
      rows_out->correct.narrow(0, start, rows).copy_(r.correct);
      at::Tensor row_loss = (1.0 - alpha) * r.ce;
      if (use_teacher) {
        rows_out->kl.narrow(0, start, rows).copy_(r.kl);
        row_loss = row_loss + (alpha * temperature * temperature) * r.kl;
      }
      total.add_((a.c * row_loss).sum());
      if (r.grad.defined()) {
        if (need_dh) {
          at::Tensor dh_rows = dh.narrow(0, start, rows);
          at::mm_out(dh_rows, r.grad, weight);
        }
        if (need_dw) dw.addmm_(r.grad.t().to(math), a.h.to(math));
      }
    }
    ctx->saved_data["dh"] = dh;
    ctx->saved_data["dw"] = dw;
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor g = grad_outputs[0];
    const at::Tensor dh = ctx->saved_data["dh"].toTensor();
    const at::Tensor dw = ctx->saved_data["dw"].toTensor();
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    at::Tensor grad_hidden = dh.defined() ? dh * g.to(dh.scalar_type()) : at::Tensor();
    at::Tensor grad_weight = dw.defined() ? (dw * g.to(dw.scalar_type())).to(weight_dtype) : at::Tensor();
    // One entry per forward argument, tensors or not.
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class FusedCheckpointedKl : public sdk::Loss {
 public:
  static constexpr sdk::PluginInfo info{
      "fused_ckpt_kl", "1.0.0",
      "CE + KL blend in row chunks: no [N, V] tensor exists, only dh [N, H] is kept for backward"};
  static std::string config_schema() {
    using sdk::Bounds;
    sdk::Schema schema;
    loss::add_distillation(schema, 1.0);
    loss::add_reduction(schema);
    return schema
        .integer("chunk_size", 0, "rows per chunk; 0 = as many as chunk_memory_mb allows", Bounds::between(0, 1LL << 32))
        .memory_knob("chunk size")
        .number("chunk_memory_mb", 1024, "workspace budget of one chunk when chunk_size is 0 (at most 1024 rows)",
                Bounds::above(0))
        .dump();
  }
  explicit FusedCheckpointedKl(const sdk::CreateContext& context)
      : s_(loss::read_settings(context.config())), on_gpu_(context.device().rfind("cuda", 0) == 0) {}

  sdk::LossResult compute(const sdk::LossInputs& in) {
    const bool distill = s_.kl_weight > 0;
    loss::validate_inputs(in, distill ? loss::TeacherNeed::kHidden : loss::TeacherNeed::kNone);
    const loss::RowCoefficients rows = loss::row_coefficients(in, s_.mean);
    const int64_t n = in.hidden.size(0), v = in.lm_head_weight.size(0);
    const bool gpu = cuda_path_applies(in.hidden);
    const int32_t element_bytes = static_cast<int32_t>(in.hidden.element_size());
    const int64_t chunk = chunk_rows(s_, n, v, workspace_bytes_per_element(gpu, element_bytes, distill));
    const at::Tensor teacher = distill ? in.teacher_hidden : at::empty({0}, in.hidden.options());
    RowOutputs row_outputs;
    sdk::LossResult result;
    result.loss = ChunkedBlend::apply(in.hidden, in.lm_head_weight, teacher, rows.coefficient, rows.safe_targets,
                                      distill, s_.kl_weight, s_.temperature, chunk, &row_outputs);
    loss::add_metrics(result, row_outputs.ce, row_outputs.kl, row_outputs.correct, rows, in);
    result.metrics.set("chunk_rows", at::scalar_tensor(static_cast<double>(chunk)));
    return result;
  }

  // One chunk's workspace, plus dh [N, H] (and dW [V, H] in fp32 when the
  // lm_head trains), which is all that is kept for backward.
  sdk::MemoryEstimate estimate_memory(const sdk::LossShape& s) const {
    const int64_t elem = loss::math_bytes(s.element_bytes);
    const bool gpu = kCudaKernels && on_gpu_ && s.element_bytes <= 4;
    const bool teacher = s.teacher == sdk::Teacher::kHidden && s_.kl_weight > 0;
    const double per_element = workspace_bytes_per_element(gpu, s.element_bytes, teacher);
    const auto chunk = static_cast<uint64_t>(chunk_rows(s_, s.rows, s.vocab, per_element));
    const auto workspace = static_cast<uint64_t>(static_cast<double>(chunk) * static_cast<double>(s.vocab) * per_element);
    uint64_t saved = static_cast<uint64_t>(s.rows * s.hidden * s.element_bytes);
    if (s.weight_trainable) saved += static_cast<uint64_t>(s.vocab * s.hidden * elem);
    return {workspace + saved, saved};
  }

 private:
  loss::LossSettings s_;
  bool on_gpu_;
};

}  // namespace

DFLASH_PLUGINS(FusedCheckpointedKl)
