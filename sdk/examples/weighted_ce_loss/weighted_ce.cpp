// An example loss plugin on the SDK's chunked-loss toolkit: cross-entropy at
// a temperature, with the batch's row weights and ignore index. The toolkit
// chunks the rows, weights and reduces them, and differentiates each chunk
// by autograd, so no [N, V] tensor outlives its chunk. CI builds it out of
// tree against the installed SDK (tests/sdk/) and checks it against fp64
// autograd of the naive formula (tests/plugins/loss/).
#include <dflash/sdk/chunked_loss.hpp>

namespace {
using namespace dflash::sdk;

class WeightedCrossEntropy : public ChunkedLoss<WeightedCrossEntropy> {
 public:
  static constexpr PluginInfo info{"example_weighted_ce", "2.0.0", "example: weighted cross-entropy (chunked)"};

  static std::string config_schema() {
    return chunked_loss_schema().number("temperature", 1.0, "logits are divided by it", Bounds::above(0).up_to(1e3)).dump();
  }

  explicit WeightedCrossEntropy(const CreateContext& context)
      : ChunkedLoss(context), temperature_(context.config().at("temperature").get<double>()) {}

  // ℓ = −log softmax(z / T)[y] for each row of the chunk.
  ChunkRows rows(const LossChunk& chunk) const {
    const at::Tensor log_q = (chunk.logits / temperature_).log_softmax(1);
    const at::Tensor nll = -log_q.gather(1, chunk.targets.unsqueeze(1)).squeeze(1);
    return {nll, {{"nll", nll.detach()}}};
  }

 private:
  double temperature_;
};

}  // namespace

DFLASH_PLUGINS(WeightedCrossEntropy)
