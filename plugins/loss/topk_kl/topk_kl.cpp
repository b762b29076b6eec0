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

#include <limits>

namespace {
using namespace dflash;

class TopKKl : public sdk::ChunkedLoss<TopKKl> {
 public:
  static constexpr sdk::PluginInfo info{"topk_kl", "1.1.0",
                                        "KL against the teacher's top-K log-probs, the missing mass kept as one bucket"};
  static std::string config_schema() {
    sdk::Schema schema = sdk::chunked_loss_schema();
    loss::add_distillation(schema, 1.0);
    return schema
        .integer("topk", 0, "use the teacher's first K columns (0 = all it provides)", sdk::Bounds::between(0, 1 << 26))
        .dump();
  }
  explicit TopKKl(const sdk::CreateContext& context)
      : ChunkedLoss(context, loss::BlendSettings::read(context.config()).teacher(sdk::Teacher::kTopK)),
        s_(loss::BlendSettings::read(context.config())),
        topk_(context.config().at("topk").get<int64_t>()) {}

  static constexpr bool reports_correct = true;

  // The blend with the bucket KL, its gradient in closed form (the blend's
  // code, loss_support, with this KL term):
  //   T·∂KL/∂z = scatter_ids(−t_k + ρ·s_k) − q·G
  // with q = softmax(z/T), s_k = q[id_k], s_r = 1 − Σ s_k, ρ = t_r / s_r (0
  // where the teacher has no rest) and G = −Σ t_k + ρ·Σ s_k: the chain rule
  // through the buckets (∂KL/∂s_k = −t_k/s_k + ρ) and the softmax.
  sdk::ChunkRows rows_and_grad(const sdk::LossChunk& chunk) const {
    return loss::blend_rows_and_grad(chunk, s_, [this](const sdk::LossChunk& c) { return bucket_kl_term(c); });
  }

  // z, q, the gradient and temporaries (measured).
  double logit_bytes(const sdk::LossShape& shape) const { return loss::math_buffers(shape, 6); }

 private:
  struct Buckets {
    at::Tensor kl;            // [r] KL between the K + 1 bucket distributions
    at::Tensor q;             // [r, V] softmax(z/T)
    at::Tensor ids;           // [r, K] the teacher's top-K ids used
    at::Tensor teacher_topk;  // [r, K] t_k, the tempered teacher buckets
    at::Tensor student_topk;  // [r, K] s_k = q[id_k]
    at::Tensor rho;           // [r, 1] t_r / s_r, 0 where the teacher has no rest
  };

  loss::KlTerm bucket_kl_term(const sdk::LossChunk& chunk) const {
    Buckets b = buckets(chunk);
    loss::KlTerm term;
    term.rows = b.kl;
    if (chunk.need_grad) {
      const at::Tensor g = b.rho * b.student_topk.sum(1, true) - b.teacher_topk.sum(1, true);
      term.t_grad = b.q.mul_(-g);  // b.q is this chunk's own buffer
      term.t_grad.scatter_add_(1, b.ids, b.rho * b.student_topk - b.teacher_topk);
    }
    return term;
  }

  // The teacher's and the student's K + 1 buckets of one chunk and their KL.
  Buckets buckets(const sdk::LossChunk& chunk) const {
    const auto math = chunk.logits.scalar_type();
    const double temperature = s_.temperature;
    at::Tensor ids = chunk.teacher_topk_ids;
    at::Tensor teacher_lp = chunk.teacher_topk_logprobs.to(math);
    if (topk_ > 0) {
      if (topk_ > ids.size(1))
        throw sdk::Error(DFLASH_ERR_INVALID_CONFIG, "topk = " + std::to_string(topk_) + " but the teacher provides only " +
                                                        std::to_string(ids.size(1)) + " columns");
      ids = ids.narrow(1, 0, topk_);
      teacher_lp = teacher_lp.narrow(1, 0, topk_);
    }
    const at::Tensor sorted = std::get<0>(ids.sort(1));
    if (sorted.size(1) > 1 &&
        sorted.narrow(1, 1, sorted.size(1) - 1).eq(sorted.narrow(1, 0, sorted.size(1) - 1)).any().item<bool>())
      throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "teacher_topk_ids repeats an id within a row");
    const double tiny = math == at::kDouble ? 1e-300 : 1e-30;
    // Teacher buckets: top-K log-probs and the rest, tempered. With K = V
    // nothing lies outside the top K: 1 − Σ is rounding, not mass.
    const at::Tensor rest = ids.size(1) == chunk.logits.size(1) ? at::zeros_like(teacher_lp.narrow(1, 0, 1))
                                                                : (1.0 - teacher_lp.exp().sum(1, true)).clamp_min(0);
    const at::Tensor log_rest =
        at::where(rest.gt(0), rest.clamp_min(tiny).log(), at::full_like(rest, -std::numeric_limits<double>::infinity()));
    const at::Tensor teacher_buckets = (at::cat({teacher_lp, log_rest}, 1) / temperature).log_softmax(1);
    const at::Tensor t = teacher_buckets.exp();
    const int64_t k = ids.size(1);
    // Student buckets from its full distribution at temperature T.
    const at::Tensor student_lq = (chunk.logits / temperature).log_softmax(1);
    const at::Tensor student_topk_log = student_lq.gather(1, ids);
    Buckets b;
    b.ids = ids;
    b.student_topk = student_topk_log.exp();
    b.teacher_topk = t.narrow(1, 0, k);
    const at::Tensor unclamped_rest = 1.0 - b.student_topk.sum(1, true);
    const at::Tensor student_rest = unclamped_rest.clamp_min(tiny);
    const at::Tensor teacher_rest = t.narrow(1, k, 1);
    const at::Tensor has_rest = teacher_rest.gt(0);
    // Rows whose teacher has no rest mass contribute 0·log(0/·) = 0: the log
    // of the student's rest is taken on a safe value there (no NaN), and ρ is
    // 0 there, as where the student's rest is clamped (no gradient through it).
    const at::Tensor safe_student_rest = at::where(has_rest, student_rest, at::ones_like(student_rest));
    const at::Tensor student_buckets = at::cat({student_topk_log, safe_student_rest.log()}, 1);
    const at::Tensor safe_teacher = at::where(t.gt(0), teacher_buckets, at::zeros_like(teacher_buckets));
    b.kl = (t * (safe_teacher - student_buckets)).sum(1);
    b.rho = at::where(has_rest.logical_and(unclamped_rest.gt(tiny)), teacher_rest / safe_student_rest,
                      at::zeros_like(teacher_rest));
    b.q = student_lq.exp_();
    return b;
  }

  loss::BlendSettings s_;
  int64_t topk_;
};

}  // namespace

DFLASH_PLUGINS(TopKKl)
