// An example loss plugin on the SDK's chunked-loss toolkit: the generalised
// Jensen–Shannon divergence between the teacher p = softmax(u/T) and the
// student q = softmax(z/T),
//   JSD_β = β·KL(p ‖ m) + (1 − β)·KL(q ‖ m),   m = β·p + (1 − β)·q,
// bounded and symmetric at β = ½. Only the per-row formula is written here;
// the toolkit chunks the rows and differentiates each chunk by autograd.
// Built out of tree in CI (tests/sdk/).
#include <dflash/sdk/chunked_loss.hpp>

#include <cmath>

namespace {
using namespace dflash::sdk;

class Jsd : public ChunkedLoss<Jsd> {
 public:
  static constexpr PluginInfo info{"example_jsd", "1.0.0", "example: generalised Jensen-Shannon divergence (chunked)"};

  static std::string config_schema() {
    return chunked_loss_schema()
        .number("beta", 0.5, "β: the teacher's share of the mixture m", Bounds::strictly_between(0, 1))
        .number("temperature", 1.0, "T of both distributions", Bounds::above(0).up_to(1e3))
        .dump();
  }

  explicit Jsd(const CreateContext& context)
      : ChunkedLoss(context, Teacher::kHidden),
        beta_(context.config().at("beta").get<double>()),
        temperature_(context.config().at("temperature").get<double>()) {}

  ChunkRows rows(const LossChunk& chunk) const {
    const at::Tensor log_p = (chunk.teacher_logits / temperature_).log_softmax(1);
    const at::Tensor log_q = (chunk.logits / temperature_).log_softmax(1);
    // log m = log(β·p + (1 − β)·q), without leaving log space.
    const at::Tensor log_m = at::logsumexp(at::stack({log_p + std::log(beta_), log_q + std::log1p(-beta_)}), 0);
    const at::Tensor jsd = beta_ * (log_p.exp() * (log_p - log_m)).sum(1) +
                           (1 - beta_) * (log_q.exp() * (log_q - log_m)).sum(1);
    return {jsd, {{"jsd", jsd.detach()}}};
  }

 private:
  double beta_, temperature_;
};

}  // namespace

DFLASH_PLUGINS(Jsd)
