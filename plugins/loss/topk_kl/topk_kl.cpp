// loss/topk_kl: KL against a teacher given only as its top-K token ids and
// log-probs. The mass the teacher puts outside its top K is kept as one more
// bucket, "the rest", and the student's distribution is coarsened the same
// way (its top-K entries, and 1 − their sum). The loss is the exact KL
// between these K + 1 bucket distributions:
//   KL = Σ_k t_k·log(t_k / q_k) + t_r·log(t_r / q_r).
// Why: dropping the rest (renormalising over K) would tell the student that
// a teacher with 40 % of its mass outside the top K is as sure as one with
// 1 %; keeping it is a true divergence (0 iff the coarse distributions agree),
// never exceeds the full KL (it is a coarsening), and equals it at K = V.
// With temperature T the K + 1 bucket log-probs are divided by T and
// renormalised — exact for the top-K buckets, an approximation for the rest.
#include "loss_support.h"

namespace {
using namespace dflash;

class TopKKl : public sdk::Loss {
 public:
  static constexpr sdk::PluginInfo info{"topk_kl", "1.0.0",
                                        "KL against the teacher's top-K log-probs, the missing mass kept as one bucket"};
  static std::string config_schema() {
    sdk::Schema schema;
    loss::add_distillation(schema, 1.0);
    loss::add_reduction(schema);
    return schema
        .integer("topk", 0, "use the teacher's first K columns (0 = all it provides)", sdk::Bounds::between(0, 1 << 26))
        .dump();
  }
  explicit TopKKl(const sdk::CreateContext& context) : s_(loss::read_settings(context.config())) {}

  sdk::LossResult compute(const sdk::LossInputs& in) {
    const bool distill = s_.kl_weight > 0;
    loss::validate_inputs(in, distill ? loss::TeacherNeed::kTopK : loss::TeacherNeed::kNone);
    const auto math = loss::math_dtype(in.hidden.scalar_type());
    const loss::RowCoefficients rows = loss::row_coefficients(in, s_.mean);
    const loss::FullLogits student = loss::full_logits(in, rows);
    const at::Tensor& logits = student.logits;
    at::Tensor row_loss = (1.0 - s_.kl_weight) * student.ce_rows;
    at::Tensor kl_rows;
    if (distill) {
      at::Tensor ids = in.teacher_topk_ids;
      at::Tensor teacher_lp = in.teacher_topk_logprobs.to(math);
      if (s_.topk > 0) {
        if (s_.topk > ids.size(1))
          throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "topk = " + std::to_string(s_.topk) + " but the teacher provides only " +
                                                          std::to_string(ids.size(1)) + " columns");
        ids = ids.narrow(1, 0, s_.topk);
        teacher_lp = teacher_lp.narrow(1, 0, s_.topk);
      }
      const at::Tensor sorted = std::get<0>(ids.sort(1));
      if (sorted.size(1) > 1 && sorted.narrow(1, 1, sorted.size(1) - 1).eq(sorted.narrow(1, 0, sorted.size(1) - 1)).any().item<bool>())
        throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "teacher_topk_ids repeats an id within a row");
      const double tiny = math == at::kDouble ? 1e-300 : 1e-30;
      // Teacher buckets (no grad): top-K log-probs and the rest, tempered.
      at::Tensor teacher_buckets;
      {
        const c10::NoGradGuard frozen_teacher;
        // With K = V nothing lies outside the top K: 1 − Σ is rounding, not mass.
        const at::Tensor rest = ids.size(1) == logits.size(1)
                                    ? at::zeros_like(teacher_lp.narrow(1, 0, 1))
                                    : (1.0 - teacher_lp.exp().sum(1, true)).clamp_min(0);
        const at::Tensor log_rest = at::where(rest.gt(0), rest.clamp_min(tiny).log(),
                                              at::full_like(rest, -std::numeric_limits<double>::infinity()));
        teacher_buckets = (at::cat({teacher_lp, log_rest}, 1) / s_.temperature).log_softmax(1);
      }
      const at::Tensor t = teacher_buckets.exp();
      // Student buckets from its full distribution at temperature T.
      const at::Tensor student_lq = (logits / s_.temperature).log_softmax(1);
      const at::Tensor student_topk = student_lq.gather(1, ids);
      const at::Tensor student_rest = (1.0 - student_topk.exp().sum(1, true)).clamp_min(tiny);
      const at::Tensor has_rest = t.narrow(1, t.size(1) - 1, 1).gt(0);
      // Rows whose teacher has no rest mass contribute 0·log(0/·) = 0; the
      // log of the student's rest is taken on a safe value there, so no NaN
      // reaches the gradient.
      const at::Tensor safe_student_rest = at::where(has_rest, student_rest, at::ones_like(student_rest));
      const at::Tensor student_buckets = at::cat({student_topk, safe_student_rest.log()}, 1);
      const at::Tensor safe_teacher = at::where(t.gt(0), teacher_buckets, at::zeros_like(teacher_buckets));
      kl_rows = (t * (safe_teacher - student_buckets)).sum(1);
      row_loss = row_loss + (s_.kl_weight * s_.temperature * s_.temperature) * kl_rows;
    }
    return loss::finish_full(in, rows, student, row_loss, kl_rows);
  }

  sdk::MemoryEstimate estimate_memory(const sdk::LossShape& s) const {
    const uint64_t nv = static_cast<uint64_t>(s.rows) * static_cast<uint64_t>(s.vocab);
    const uint64_t elem = static_cast<uint64_t>(loss::math_bytes(s.element_bytes));
    return {nv * (elem * 5 + static_cast<uint64_t>(s.element_bytes)), nv * elem * 3};
  }

 private:
  loss::LossSettings s_;
};

}  // namespace

DFLASH_PLUGINS(TopKKl)
