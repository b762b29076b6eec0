// The example's own test, with the SDK's loss test kit (ctest in its build):
// the loss and its gradients against the naive formula in fp64, over chunk
// sizes and reductions, with a frozen and a trainable lm_head; then its
// memory against its declared bound. No host, no GPU.
#include "../reverse_kl.cpp"  // the plugin's class, compiled into this test

#include <dflash/sdk/loss_testing.hpp>

#include <iostream>

int main() {
  using namespace dflash::sdk::loss_kit;
  const double t = 1.7;
  // KL(q ‖ p), q = softmax(z/T) the student's, p = softmax(u/T) the teacher's.
  const RowFormula formula = [t](const at::Tensor& z, const at::Tensor& u, const at::Tensor&) {
    const at::Tensor log_q = (z / t).log_softmax(1), log_p = (u / t).log_softmax(1);
    return (log_q.exp() * (log_q - log_p)).sum(1);
  };
  bool ok = true;
  for (bool trainable : {false, true}) {
    CheckShape shape;
    shape.weight_trainable = trainable;
    const CheckResult values = check_loss_against_reference<ReverseKl>(formula, {{"temperature", t}}, {1, 7, 64, 0}, shape);
    std::cout << "values (lm_head " << (trainable ? "trainable" : "frozen") << "): " << values.report() << "\n";
    ok = ok && values.ok();
  }
  const MemoryResult memory = check_loss_memory<ReverseKl>({{"temperature", t}});
  std::cout << "memory: " << memory.report() << "\n";
  return ok && memory.ok() ? 0 : 1;
}
