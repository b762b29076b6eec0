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

namespace {
using namespace dflash;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Per-row outputs of the chunk loop, for the metrics.
struct RowOutputs {
  at::Tensor ce, kl, correct;
};

// [chunk, V] buffers alive at once inside a chunk, in the math dtype:
// student logits, their gradient, teacher log-probs, student log-probs at T,
// and temporaries; sizes the automatic chunk.
constexpr int64_t kWorkspaceRowsOfV = 6;

int64_t chunk_rows(const loss::LossSettings& s, int64_t n, int64_t v, int64_t math_bytes) {
  int64_t rows = s.chunk_size;
  if (rows <= 0) {
    const double budget = s.chunk_memory_mb * 1024.0 * 1024.0;
    rows = static_cast<int64_t>(budget / static_cast<double>(v * kWorkspaceRowsOfV * math_bytes));
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
    const bool need_grad = need_dh || need_dw;
    const bool ce_term = alpha < 1.0;
    const bool kl_term = use_teacher && alpha > 0.0;

    at::Tensor dh = need_dh ? at::empty_like(hidden) : at::Tensor();
    at::Tensor dw = need_dw ? at::zeros(weight.sizes(), weight.options().dtype(math)) : at::Tensor();
    at::Tensor total = at::zeros({}, hidden.options().dtype(math));
    rows_out->ce = at::empty({n}, hidden.options().dtype(math));
    rows_out->correct = at::empty({n}, hidden.options().dtype(at::kBool));
    if (use_teacher) rows_out->kl = at::empty({n}, hidden.options().dtype(math));

    const at::Tensor weight_t = weight.t();
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t rows = std::min(chunk, n - start);
      const at::Tensor h = hidden.narrow(0, start, rows);
      const at::Tensor y = targets.narrow(0, start, rows).unsqueeze(1);
      const at::Tensor c = coefficient.narrow(0, start, rows).unsqueeze(1);

      at::Tensor z = at::matmul(h, weight_t).to(math);  // [rows, V]
      const at::Tensor lse = z.logsumexp(1, true);
      const at::Tensor ce = (lse - z.gather(1, y)).squeeze(1);
      rows_out->ce.narrow(0, start, rows).copy_(ce);
      rows_out->correct.narrow(0, start, rows).copy_(z.argmax(1).eq(y.squeeze(1)));
      at::Tensor row_loss = ce_term ? (1.0 - alpha) * ce : at::zeros_like(ce);

      at::Tensor grad;  // dℓ/dz for the chunk, [rows, V]
      if (need_grad && ce_term) {
        grad = (z - lse).exp_().mul_((1.0 - alpha) * c);
        grad.scatter_add_(1, y, -(1.0 - alpha) * c);
      }
      if (use_teacher) {
        const at::Tensor teacher_log_p =
            at::matmul(teacher_hidden.narrow(0, start, rows), weight_t).to(math).div_(temperature).log_softmax(1);
        const at::Tensor student_log_q = (temperature == 1.0 ? z : z / temperature).log_softmax(1);
        const at::Tensor teacher_p = teacher_log_p.exp();
        const at::Tensor kl = (teacher_p * (teacher_log_p - student_log_q)).sum(1);
        rows_out->kl.narrow(0, start, rows).copy_(kl);
        if (kl_term) {
          row_loss = row_loss + (alpha * temperature * temperature) * kl;
          if (need_grad) {
            at::Tensor kl_grad = student_log_q.exp().sub_(teacher_p).mul_((alpha * temperature) * c);
            grad = grad.defined() ? grad.add_(kl_grad) : kl_grad;
          }
        }
      }
      z = at::Tensor();  // the chunk's logits die here
      total.add_((c.squeeze(1) * row_loss).sum());
      if (need_grad) {
        if (!grad.defined()) grad = at::zeros({rows, weight.size(0)}, hidden.options().dtype(math));
        const at::Tensor grad_in = grad.to(hidden.scalar_type());
        if (need_dh) dh.narrow(0, start, rows).copy_(at::matmul(grad_in, weight));
        if (need_dw) dw.addmm_(grad.t(), h.to(math));
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
        .integer("chunk_size", 0, "rows per chunk; 0 = as many as chunk_memory_mb allows", Bounds::at_least(0))
        .number("chunk_memory_mb", 512, "workspace budget of one chunk when chunk_size is 0", Bounds::above(0))
        .dump();
  }
  explicit FusedCheckpointedKl(const sdk::CreateContext& context) : s_(loss::read_settings(context.config())) {}

  sdk::LossResult compute(const sdk::LossInputs& in) {
    const bool distill = s_.kl_weight > 0;
    loss::validate_inputs(in, distill ? loss::TeacherNeed::kHidden : loss::TeacherNeed::kNone);
    const auto math = loss::math_dtype(in.hidden.scalar_type());
    const loss::RowCoefficients rows = loss::row_coefficients(in, s_.mean);
    const int64_t n = in.hidden.size(0), v = in.lm_head_weight.size(0);
    const int64_t chunk = chunk_rows(s_, n, v, math == at::kDouble ? 8 : 4);
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
    const auto chunk = static_cast<uint64_t>(chunk_rows(s_, s.rows, s.vocab, elem));
    const uint64_t workspace = chunk * static_cast<uint64_t>(s.vocab * kWorkspaceRowsOfV * elem);
    uint64_t saved = static_cast<uint64_t>(s.rows * s.hidden * s.element_bytes);
    if (s.weight_trainable) saved += static_cast<uint64_t>(s.vocab * s.hidden * elem);
    return {workspace + saved, saved};
  }

 private:
  loss::LossSettings s_;
};

}  // namespace

DFLASH_PLUGINS(FusedCheckpointedKl)
