// Chunked losses that break the toolkit's contract, one way each.
#include <dflash/sdk/chunked_loss.hpp>

namespace {
using namespace dflash::sdk;

std::string schema() { return chunked_loss_schema().dump(); }

class BadLossShape : public ChunkedLoss<BadLossShape> {
 public:
  static constexpr PluginInfo info{"bad_loss_shape", "0.0.1", "returns [r, 1] losses"};
  static std::string config_schema() { return schema(); }
  explicit BadLossShape(const CreateContext& c) : ChunkedLoss(c) {}
  ChunkRows rows(const LossChunk& chunk) const { return {chunk.logits.logsumexp(1, /*keepdim=*/true)}; }
};

class BadGradShape : public ChunkedLoss<BadGradShape> {
 public:
  static constexpr PluginInfo info{"bad_grad_shape", "0.0.1", "returns a [r] gradient"};
  static std::string config_schema() { return schema(); }
  explicit BadGradShape(const CreateContext& c) : ChunkedLoss(c) {}
  ChunkRows rows_and_grad(const LossChunk& chunk) const {
    ChunkRows out{chunk.logits.logsumexp(1)};
    out.grad = chunk.coefficient;
    return out;
  }
};

class DetachedLoss : public ChunkedLoss<DetachedLoss> {
 public:
  static constexpr PluginInfo info{"detached_loss", "0.0.1", "a loss that ignores the logits"};
  static std::string config_schema() { return schema(); }
  explicit DetachedLoss(const CreateContext& c) : ChunkedLoss(c) {}
  ChunkRows rows(const LossChunk& chunk) const { return {at::zeros({chunk.logits.size(0)}, chunk.coefficient.options())}; }
};

class BadMetricShape : public ChunkedLoss<BadMetricShape> {
 public:
  static constexpr PluginInfo info{"bad_metric_shape", "0.0.1", "a 0-dim metric"};
  static std::string config_schema() { return schema(); }
  explicit BadMetricShape(const CreateContext& c) : ChunkedLoss(c) {}
  ChunkRows rows(const LossChunk& chunk) const {
    const at::Tensor lse = chunk.logits.logsumexp(1);
    return {lse, {{"mean", lse.detach().mean()}}};
  }
};

class NoToolkitSchema : public ChunkedLoss<NoToolkitSchema> {
 public:
  static constexpr PluginInfo info{"no_toolkit_schema", "0.0.1", "its schema lacks the toolkit's settings"};
  static std::string config_schema() { return Schema().number("temperature", 1.0, "unused", Bounds::above(0)).dump(); }
  explicit NoToolkitSchema(const CreateContext& c) : ChunkedLoss(c) {}
  ChunkRows rows(const LossChunk& chunk) const { return {chunk.logits.logsumexp(1)}; }
};

}  // namespace

DFLASH_PLUGINS(BadLossShape, BadGradShape, DetachedLoss, BadMetricShape, NoToolkitSchema)
