// The example's own test, with the SDK's loss test kit (ctest in its build):
// the loss and its gradients against the naive formula in fp64, over chunk
// sizes and reductions; then its memory against its declared bound.
#include "../weighted_ce.cpp"  // the plugin's class, compiled into this test

#include <dflash/sdk/loss_testing.hpp>

#include <iostream>

int main() {
  using namespace dflash::sdk::loss_kit;
  const double t = 1.3;
  // −log softmax(z/T)[y]; no teacher.
  const RowFormula formula = [t](const at::Tensor& z, const at::Tensor&, const at::Tensor& y) {
    return -(z / t).log_softmax(1).gather(1, y.unsqueeze(1)).squeeze(1);
  };
  CheckShape shape;
  shape.teacher = dflash::sdk::Teacher::kNone;
  const CheckResult values = check_loss_against_reference<WeightedCrossEntropy>(formula, {{"temperature", t}}, {1, 7, 64, 0}, shape);
  std::cout << "values: " << values.report() << "\n";
  CheckShape memory_shape{512, 64, 4096};
  memory_shape.teacher = dflash::sdk::Teacher::kNone;
  const MemoryResult memory = check_loss_memory<WeightedCrossEntropy>({{"temperature", t}}, memory_shape);
  std::cout << "memory: " << memory.report() << "\n";
  return values.ok() && memory.ok() ? 0 : 1;
}
