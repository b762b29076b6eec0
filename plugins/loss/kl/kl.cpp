// loss/kl: full-vocabulary KL(teacher ‖ student) at temperature T, blended
// with CE: ℓ = (1 − α)·CE + α·T²·KL. The teacher's logits come from its hidden
// states through the same lm_head, without gradient. On the SDK's
// chunked-loss toolkit, differentiated by autograd chunk by chunk: the plain
// formula, memory-bounded. fused_ckpt_kl computes the same loss with a
// closed-form gradient and CUDA kernels.
#include "loss_support.h"

namespace {
using namespace dflash;

class KlDivergence : public sdk::ChunkedLoss<KlDivergence> {
 public:
  static constexpr sdk::PluginInfo info{"kl", "1.1.0",
                                        "full-vocabulary KL(teacher || student), optionally blended with CE (chunked)"};
  static std::string config_schema() {
    sdk::Schema schema = sdk::chunked_loss_schema();
    return loss::add_distillation(schema, 1.0).dump();
  }
  explicit KlDivergence(const sdk::CreateContext& context)
      : ChunkedLoss(context, loss::BlendSettings::read(context.config()).teacher(sdk::Teacher::kHidden)),
        s_(loss::BlendSettings::read(context.config())) {}

  sdk::ChunkRows rows(const sdk::LossChunk& chunk) const {
    const at::Tensor kl = s_.kl_weight > 0 ? loss::kl_rows(chunk, s_.temperature) : at::Tensor();
    return loss::blend_rows(s_, loss::ce_rows(chunk), kl);
  }

  // z, u, both log-softmaxes, their gradients (about 6.3 measured).
  double logit_bytes(const sdk::LossShape& shape) const { return loss::math_buffers(shape, 8); }

 private:
  loss::BlendSettings s_;
};

}  // namespace

DFLASH_PLUGINS(KlDivergence)
