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
      .number("temperature", 1.0, "T of the distillation term (CE stays at temperature 1)", Bounds::above(0));
}

at::Tensor ce_rows(const sdk::LossChunk& chunk) {
  return chunk.logits.logsumexp(1) - chunk.logits.gather(1, chunk.targets.unsqueeze(1)).squeeze(1);
}

at::Tensor kl_rows(const sdk::LossChunk& chunk, double temperature) {
  const at::Tensor teacher_log_p = (chunk.teacher_logits / temperature).log_softmax(1);
  const at::Tensor student_log_q = (chunk.logits / temperature).log_softmax(1);
  return (teacher_log_p.exp() * (teacher_log_p - student_log_q)).sum(1);
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
