// An example loss plugin on the SDK's chunked-loss toolkit, with the
// optional fast path: reverse KL(q ‖ p) of the student q = softmax(z/T)
// from the teacher p = softmax(u/T), mode-seeking where the forward KL
// covers every mode. Its gradient has a closed form,
//   ∂KL/∂z_j = q_j·(log q_j − log p_j − KL) / T,
// so the toolkit builds no autograd graph: it calls rows_and_grad() for each
// chunk and keeps only dL/dh. Built out of tree in CI (tests/sdk/).
#include <dflash/sdk/chunked_loss.hpp>

namespace {
using namespace dflash::sdk;

class ReverseKl : public ChunkedLoss<ReverseKl> {
 public:
  static constexpr PluginInfo info{"example_reverse_kl", "1.0.0", "example: KL(student || teacher), closed-form gradient"};

  static std::string config_schema() {
    return chunked_loss_schema().number("temperature", 1.0, "T of both distributions", Bounds::above(0).up_to(1e3)).dump();
  }

  explicit ReverseKl(const CreateContext& context)
      : ChunkedLoss(context, Teacher::kHidden), temperature_(context.config().at("temperature").get<double>()) {}

  // ℓ = Σ_j q_j·(log q_j − log p_j) per row, and ∂(Σ c·ℓ)/∂z when asked.
  ChunkRows rows_and_grad(const LossChunk& chunk) const {
    const at::Tensor log_q = (chunk.logits / temperature_).log_softmax(1);
    const at::Tensor log_ratio = log_q - (chunk.teacher_logits / temperature_).log_softmax(1);
    const at::Tensor q = log_q.exp();
    const at::Tensor kl = (q * log_ratio).sum(1);
    ChunkRows out{kl, {{"reverse_kl", kl}}};
    if (chunk.need_grad)
      out.grad = q * (log_ratio - kl.unsqueeze(1)) * (chunk.coefficient.unsqueeze(1) / temperature_);
    return out;
  }

 private:
  double temperature_;
};

}  // namespace

DFLASH_PLUGINS(ReverseKl)
