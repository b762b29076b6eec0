// loss/ce: cross-entropy with row weights and an ignore index, on the SDK's
// chunked-loss toolkit: ℓ_i = lse(z_i) − z_i[y_i], differentiated by autograd
// one chunk at a time, so no [N, V] tensor outlives its chunk.
#include "loss_support.h"

namespace {
using namespace dflash;

class CrossEntropy : public sdk::ChunkedLoss<CrossEntropy> {
 public:
  static constexpr sdk::PluginInfo info{"ce", "1.1.0", "cross-entropy with row weights and an ignore index (chunked)"};
  static std::string config_schema() { return sdk::chunked_loss_schema().dump(); }
  explicit CrossEntropy(const sdk::CreateContext& context) : ChunkedLoss(context) {}

  sdk::ChunkRows rows(const sdk::LossChunk& chunk) const {
    const at::Tensor ce = loss::ce_rows(chunk);
    return {ce, {{"ce", ce.detach()}}};
  }

  // The chunk's logits, their softmax and its gradient (about 3.5 measured).
  double logit_bytes(const sdk::LossShape& shape) const { return loss::math_buffers(shape, 5); }
};

}  // namespace

DFLASH_PLUGINS(CrossEntropy)
