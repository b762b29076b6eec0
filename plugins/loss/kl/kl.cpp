// loss/kl: full-vocabulary KL(teacher ‖ student) at temperature T, blended
// with CE: ℓ = (1 − α)·CE + α·T²·KL. The teacher's logits come from its hidden
// states through the same lm_head, without gradient. Full [N, V] tensors
// through autograd: the plain reference for fused_ckpt_kl.
#include "loss_support.h"

namespace {
using namespace dflash;

class KlDivergence : public sdk::Loss {
 public:
  static constexpr sdk::PluginInfo info{"kl", "1.0.0",
                                        "full-vocabulary KL(teacher || student), optionally blended with CE (reference)"};
  static std::string config_schema() {
    sdk::Schema schema;
    loss::add_distillation(schema, 1.0);
    return loss::add_reduction(schema).dump();
  }
  explicit KlDivergence(const sdk::CreateContext& context) : s_(loss::read_settings(context.config())) {}

  sdk::LossResult compute(const sdk::LossInputs& in) {
    const bool distill = s_.kl_weight > 0;
    loss::validate_inputs(in, distill ? loss::TeacherNeed::kHidden : loss::TeacherNeed::kNone);
    const auto math = loss::math_dtype(in.hidden.scalar_type());
    const loss::RowCoefficients rows = loss::row_coefficients(in, s_.mean);
    const loss::FullLogits student = loss::full_logits(in, rows);
    const at::Tensor& logits = student.logits;
    at::Tensor row_loss = (1.0 - s_.kl_weight) * student.ce_rows;
    at::Tensor kl_rows;
    if (distill) {
      at::Tensor teacher_log_p;
      {
        const c10::NoGradGuard frozen_teacher;
        teacher_log_p = (at::matmul(in.teacher_hidden, in.lm_head_weight.t()).to(math) / s_.temperature).log_softmax(1);
      }
      const at::Tensor student_log_q = (logits / s_.temperature).log_softmax(1);
      kl_rows = (teacher_log_p.exp() * (teacher_log_p - student_log_q)).sum(1);
      row_loss = row_loss + (s_.kl_weight * s_.temperature * s_.temperature) * kl_rows;
    }
    return loss::finish_full(in, rows, student, row_loss, kl_rows);
  }

  // Student logits, both log-softmaxes, the teacher probabilities, gradients.
  sdk::MemoryEstimate estimate_memory(const sdk::LossShape& s) const {
    const uint64_t nv = static_cast<uint64_t>(s.rows) * static_cast<uint64_t>(s.vocab);
    const uint64_t elem = static_cast<uint64_t>(loss::math_bytes(s.element_bytes));
    return {nv * (elem * 7 + 2 * static_cast<uint64_t>(s.element_bytes)), nv * elem * 4};
  }

 private:
  loss::LossSettings s_;
};

}  // namespace

DFLASH_PLUGINS(KlDivergence)
