// loss/ce: cross-entropy with row weights and an ignore index, on the full
// [N, V] logits through autograd. Plain on purpose: it is the reference the
// memory-bounded losses are checked against.
#include "loss_support.h"

namespace {
using namespace dflash;

class CrossEntropy : public sdk::Loss {
 public:
  static constexpr sdk::PluginInfo info{"ce", "1.0.0",
                                        "cross-entropy with row weights and an ignore index (full logits, reference)"};
  static std::string config_schema() {
    sdk::Schema schema;
    return loss::add_reduction(schema).dump();
  }
  explicit CrossEntropy(const sdk::CreateContext& context) : settings_(loss::read_settings(context.config())) {}

  sdk::LossResult compute(const sdk::LossInputs& in) {
    loss::validate_inputs(in, loss::TeacherNeed::kNone);
    const loss::RowCoefficients rows = loss::row_coefficients(in, settings_.mean);
    const loss::FullLogits student = loss::full_logits(in, rows);
    return loss::finish_full(in, rows, student, student.ce_rows, at::Tensor());
  }

  // fp32 logits, their log-softmax for backward and the gradient.
  sdk::MemoryEstimate estimate_memory(const sdk::LossShape& s) const {
    const uint64_t nv = static_cast<uint64_t>(s.rows) * static_cast<uint64_t>(s.vocab);
    const uint64_t elem = static_cast<uint64_t>(loss::math_bytes(s.element_bytes));
    return {nv * (elem * 3 + static_cast<uint64_t>(s.element_bytes)), nv * elem * 2};
  }

 private:
  loss::LossSettings settings_;
};

}  // namespace

DFLASH_PLUGINS(CrossEntropy)
