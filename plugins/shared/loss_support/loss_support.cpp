#include "loss_support.h"

namespace dflash::loss {

BlendSettings BlendSettings::read(const nlohmann::json& config) {
  return {config.at("kl_weight").get<double>(), config.at("temperature").get<double>()};
}

sdk::Schema& add_distillation(sdk::Schema& schema, double default_kl_weight) {
  using sdk::Bounds;
  return schema
      .number("kl_weight", default_kl_weight,
              "α in (1 − α)·CE + α·T²·KL(teacher ‖ student); 0 = CE only, 1 = KL only", Bounds::between(0, 1))
      .number("temperature", 1.0, "T of the distillation term (CE stays at temperature 1)", Bounds::above(0).up_to(1e3));
}

KlTerm full_kl_term(const sdk::LossChunk& c, double t) {
  const at::Tensor teacher_log_p = c.teacher_logits.div(t).log_softmax(1);
  const at::Tensor student_log_q = (t == 1.0 ? c.logits : c.logits / t).log_softmax(1);
  const at::Tensor teacher_p = teacher_log_p.exp();
  KlTerm term;
  term.rows = (teacher_p * (teacher_log_p - student_log_q)).sum(1);
  if (c.need_grad) term.t_grad = student_log_q.exp().sub_(teacher_p);
  return term;
}

sdk::ChunkRows blend_rows_and_grad(const sdk::LossChunk& c, const BlendSettings& s, const KlTermFn& kl_term) {
  const double alpha = s.kl_weight, t = s.temperature;
  const at::Tensor& z = c.logits;
  const at::Tensor y = c.targets.unsqueeze(1), coefficient = c.coefficient.unsqueeze(1);
  const at::Tensor lse = z.logsumexp(1, true);
  const at::Tensor ce = (lse - z.gather(1, y)).squeeze(1);
  at::Tensor kl, grad;
  if (c.need_grad && alpha < 1.0) {
    grad = (z - lse).exp_().mul_((1.0 - alpha) * coefficient);
    grad.scatter_add_(1, y, -(1.0 - alpha) * coefficient);
  }
  if (alpha > 0) {
    KlTerm term = kl_term ? kl_term(c) : full_kl_term(c, t);
    kl = term.rows;
    if (c.need_grad) {
      at::Tensor kl_grad = term.t_grad.mul_((alpha * t) * coefficient);
      grad = grad.defined() ? grad.add_(kl_grad) : kl_grad;
    }
  }
  if (c.need_grad && !grad.defined()) grad = at::zeros_like(z);
  sdk::ChunkRows out = blend_rows(s, ce, kl);
  out.grad = grad;
  out.correct = z.argmax(1).eq(c.targets);
  return out;
}

sdk::ChunkRows blend_rows(const BlendSettings& s, const at::Tensor& ce, const at::Tensor& kl) {
  sdk::ChunkRows out;
  out.loss = (1.0 - s.kl_weight) * ce;
  out.metrics.set("ce", ce.detach());
  if (kl.defined()) {
    out.loss = out.loss + (s.kl_weight * s.temperature * s.temperature) * kl;
    out.metrics.set("kl", kl.detach());
  }
  return out;
}

}  // namespace dflash::loss
