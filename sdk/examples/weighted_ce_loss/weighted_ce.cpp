// An example loss plugin: cross-entropy with per-row weights and an ignore
// index, computed on the full [N, V] logits. Small and plain on purpose: CI
// builds it out of tree against the installed SDK (tests/sdk/), and it is a
// second template beside the one docs/writing-plugins.md walks through.
#include <dflash/sdk/loss.hpp>

#include <torch/torch.h>

namespace {

class WeightedCrossEntropy : public dflash::sdk::Loss {
 public:
  static constexpr dflash::sdk::PluginInfo info{"example_weighted_ce", "1.0.0",
                                                "example: weighted cross-entropy on full logits"};

  static std::string config_schema() {
    using dflash::sdk::Bounds;
    return dflash::sdk::Schema()
        .number("temperature", 1.0, "logits are divided by it", Bounds::above(0))
        .string("reduction", "mean", "mean: divide by the total row weight; sum: plain sum", {"mean", "sum"})
        .dump();
  }

  explicit WeightedCrossEntropy(const dflash::sdk::CreateContext& context)
      : temperature_(context.config().at("temperature").get<double>()),
        mean_(context.config().at("reduction").get<std::string>() == "mean") {}

  dflash::sdk::LossResult compute(const dflash::sdk::LossInputs& in) {
    const auto n = in.hidden.size(0);
    if (in.targets.dim() != 1 || in.targets.size(0) != n)
      throw dflash::sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "targets must be [N] with N = hidden.size(0)");
    const torch::Tensor logits = torch::matmul(in.hidden, in.lm_head_weight.t()).to(torch::kFloat) / temperature_;
    const torch::Tensor valid = in.targets.ne(in.ignore_index);
    const torch::Tensor safe_targets = torch::where(valid, in.targets, torch::zeros_like(in.targets));
    const torch::Tensor nll =
        -torch::log_softmax(logits, -1).gather(1, safe_targets.unsqueeze(1)).squeeze(1);
    torch::Tensor weights = valid.to(torch::kFloat);
    if (in.row_weights.defined()) weights = weights * in.row_weights.to(torch::kFloat);
    torch::Tensor loss = (nll * weights).sum();
    if (mean_) loss = loss / weights.sum().clamp_min(1e-12);

    dflash::sdk::LossResult result;
    result.loss = loss;
    const torch::NoGradGuard no_grad;
    result.metrics.set("ce", loss.detach());
    result.metrics.set("accuracy", (logits.argmax(-1).eq(in.targets) & valid).to(torch::kFloat));
    return result;
  }

  // [N, V] fp32 logits and their log-softmax live until backward.
  dflash::sdk::MemoryEstimate estimate_memory(const dflash::sdk::LossShape& shape) const {
    const uint64_t logits = static_cast<uint64_t>(shape.rows) * static_cast<uint64_t>(shape.vocab) * 4;
    return {3 * logits, 2 * logits};
  }

 private:
  double temperature_;
  bool mean_;
};

}  // namespace

DFLASH_PLUGINS(WeightedCrossEntropy)
