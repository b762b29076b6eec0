// The SDK's loss test kit (dflash/sdk/loss_testing.hpp) can fail: a formula
// that is not the loss's, a closed-form gradient that is off, a loss that
// keeps full [rows, V] logits and an estimate below the measured peak are
// each reported, naming the case. (Its passing use is the examples' own
// tests, sdk/examples/*/test/, run here and out of tree.)
#include "../../sdk/examples/reverse_kl_loss/reverse_kl.cpp"  // a correct loss, as its author ships it

#include <dflash/sdk/loss_testing.hpp>

#include <gtest/gtest.h>

namespace {
using namespace dflash::sdk;
using namespace dflash::sdk::loss_kit;

bool any_failure_has(const std::vector<std::string>& failures, const std::string& words) {
  for (const std::string& f : failures)
    if (f.find(words) != std::string::npos) return true;
  return false;
}

// The reverse KL's closed-form gradient, off by a factor: values right, gradients wrong.
class SkewedGradient : public ChunkedLoss<SkewedGradient> {
 public:
  static constexpr PluginInfo info{"skewed_gradient", "1.0.0", "a test loss with a wrong gradient"};
  static std::string config_schema() { return chunked_loss_schema().dump(); }
  explicit SkewedGradient(const CreateContext& context) : ChunkedLoss(context, Teacher::kHidden) {}
  ChunkRows rows_and_grad(const LossChunk& chunk) const {
    const at::Tensor log_q = chunk.logits.log_softmax(1);
    const at::Tensor log_ratio = log_q - chunk.teacher_logits.log_softmax(1);
    const at::Tensor q = log_q.exp();
    const at::Tensor kl = (q * log_ratio).sum(1);
    ChunkRows out{kl, {}};
    if (chunk.need_grad) out.grad = 1.01 * q * (log_ratio - kl.unsqueeze(1)) * chunk.coefficient.unsqueeze(1);
    return out;
  }
};

// Cross-entropy over the whole batch's logits at once: right values, and
// [rows, V] alive; its estimate claims a chunk's worth.
class FullLogits : public Loss {
 public:
  static constexpr PluginInfo info{"full_logits", "1.0.0", "a test loss that keeps every logit"};
  static std::string config_schema() { return Schema().dump(); }
  explicit FullLogits(const CreateContext&) {}
  LossResult compute(const LossInputs& in) {
    const at::Tensor valid = in.targets.ne(in.ignore_index);
    const at::Tensor y = in.targets.masked_fill(valid.logical_not(), 0);
    const at::Tensor nll = -in.hidden.matmul(in.lm_head_weight.t()).log_softmax(1).gather(1, y.unsqueeze(1)).squeeze(1);
    const at::Tensor w = in.row_weights * valid.to(in.row_weights.scalar_type());
    return {(w * nll.where(valid, at::zeros({}, nll.options()))).sum() / w.sum(), {}};
  }
  MemoryEstimate estimate_memory(const LossShape& shape) { return {static_cast<uint64_t>(64 * shape.vocab * 4), 0}; }
};

const RowFormula kReverseKl = [](const at::Tensor& z, const at::Tensor& u, const at::Tensor&) {
  const at::Tensor log_q = z.log_softmax(1), log_p = u.log_softmax(1);
  return (log_q.exp() * (log_q - log_p)).sum(1);
};

TEST(LossKit, ACorrectLossPassesEveryCase) {
  const CheckResult r = check_loss_against_reference<ReverseKl>(kReverseKl, {{"temperature", 1.0}});
  EXPECT_TRUE(r.ok()) << r.report();
  EXPECT_EQ(r.cases, 8) << "two reductions × four chunk sizes";
  EXPECT_LT(r.worst_grad_error, 1e-12) << r.report();
}

TEST(LossKit, AFormulaThatIsNotTheLossIsReportedByCase) {
  // The forward KL(p ‖ q), not the reverse one the loss computes.
  const RowFormula forward = [](const at::Tensor& z, const at::Tensor& u, const at::Tensor&) {
    const at::Tensor log_q = z.log_softmax(1), log_p = u.log_softmax(1);
    return (log_p.exp() * (log_p - log_q)).sum(1);
  };
  const CheckResult r = check_loss_against_reference<ReverseKl>(forward, {{"temperature", 1.0}});
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(any_failure_has(r.failures, "example_reverse_kl, reduction mean, chunk_size 7: loss ")) << r.report();
}

TEST(LossKit, AClosedFormGradientThatIsOffIsReported) {
  CheckShape shape;
  shape.weight_trainable = true;
  const CheckResult r = check_loss_against_reference<SkewedGradient>(kReverseKl, {}, {1, 7, 64, 0}, shape);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(any_failure_has(r.failures, "dL/dh differs from the formula's")) << r.report();
  EXPECT_TRUE(any_failure_has(r.failures, "dL/dW differs from the formula's")) << r.report();
  EXPECT_FALSE(any_failure_has(r.failures, ": loss ")) << "its values are right: " << r.report();
}

TEST(LossKit, MemoryTheLossDoesNotBoundIsReported) {
  const MemoryResult bounded = check_loss_memory<ReverseKl>({{"temperature", 1.0}});
  EXPECT_TRUE(bounded.ok()) << bounded.report();
  EXPECT_LT(bounded.measured_bytes_4x, bounded.full_logits_bytes / 4) << bounded.report();
  CheckShape shape{512, 64, 4096};
  shape.teacher = Teacher::kNone;
  const MemoryResult full = check_loss_memory<FullLogits>({}, shape);
  EXPECT_FALSE(full.ok());
  EXPECT_TRUE(any_failure_has(full.failures, "the peak grew by")) << full.report();
  EXPECT_TRUE(any_failure_has(full.failures, "estimate_memory says")) << full.report();
}

}  // namespace
