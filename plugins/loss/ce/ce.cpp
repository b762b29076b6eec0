// loss/ce: cross-entropy with row weights and an ignore index, on the SDK's
// chunked-loss toolkit: ℓ_i = lse(z_i) − z_i[y_i] with its closed-form
// gradient c·(softmax(z) − onehot(y)), one chunk at a time, so no [N, V]
// tensor outlives its chunk. The blend of loss/kl at α = 0, by the same code.
#include "loss_support.h"

namespace {
using namespace dflash;

class CrossEntropy : public sdk::ChunkedLoss<CrossEntropy> {
 public:
  static constexpr sdk::PluginInfo info{"ce", "1.1.0", "cross-entropy with row weights and an ignore index (chunked)"};
  static std::string config_schema() { return sdk::chunked_loss_schema().dump(); }
  explicit CrossEntropy(const sdk::CreateContext& context) : ChunkedLoss(context) {}

  static constexpr bool reports_correct = true;

  sdk::ChunkRows rows_and_grad(const sdk::LossChunk& chunk) const {
    return loss::blend_rows_and_grad(chunk, {0.0, 1.0});
  }

  // The chunk's logits and their gradient, with temporaries (measured).
  double logit_bytes(const sdk::LossShape& shape) const { return loss::math_buffers(shape, 3); }
};

}  // namespace

DFLASH_PLUGINS(CrossEntropy)
