// The example's own test, with the SDK's loss test kit (ctest in its build):
// the loss and its gradients against the naive formula in fp64, over chunk
// sizes and reductions; then its memory against its declared bound.
#include "../jsd.cpp"  // the plugin's class, compiled into this test

#include <dflash/sdk/loss_testing.hpp>

#include <iostream>

int main() {
  using namespace dflash::sdk::loss_kit;
  const double beta = 0.3, t = 1.5;
  // β KL(p ‖ m) + (1 − β) KL(q ‖ m), m = β p + (1 − β) q.
  const RowFormula formula = [beta, t](const at::Tensor& z, const at::Tensor& u, const at::Tensor&) {
    const at::Tensor p = (u / t).softmax(1), q = (z / t).softmax(1);
    const at::Tensor m = beta * p + (1 - beta) * q;
    return beta * (p * (p.log() - m.log())).sum(1) + (1 - beta) * (q * (q.log() - m.log())).sum(1);
  };
  const CheckResult values = check_loss_against_reference<Jsd>(formula, {{"beta", beta}, {"temperature", t}});
  std::cout << "values: " << values.report() << "\n";
  const MemoryResult memory = check_loss_memory<Jsd>({{"beta", beta}, {"temperature", t}});
  std::cout << "memory: " << memory.report() << "\n";
  return values.ok() && memory.ok() ? 0 : 1;
}
