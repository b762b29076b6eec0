// loss/kl: full-vocabulary KL(teacher ‖ student) at temperature T, blended
// with CE: ℓ = (1 − α)·CE + α·T²·KL. The teacher's logits come from its hidden
// states through the same lm_head, without gradient. On the SDK's
// chunked-loss toolkit with the blend's closed-form gradient in LibTorch
// operators (loss_support), any device and dtype; fused_ckpt_kl runs the
// same code off the GPU and its CUDA kernels on it.
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

  static constexpr bool reports_correct = true;

  sdk::ChunkRows rows_and_grad(const sdk::LossChunk& chunk) const { return loss::blend_rows_and_grad(chunk, s_); }

  // z, u, both log-softmaxes, the gradient and temporaries (measured).
  double logit_bytes(const sdk::LossShape& shape) const { return loss::math_buffers(shape, 8); }

 private:
  loss::BlendSettings s_;
};

}  // namespace

DFLASH_PLUGINS(KlDivergence)
