#include "generate/sampling.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace dflash::generate {
namespace {

// splitmix64's finaliser: neighbouring (seed, index) pairs give unrelated
// engine seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::vector<int64_t> to_ids(const at::Tensor& ids) {
  const at::Tensor cpu = ids.to(at::kCPU, at::kLong).contiguous();
  return {cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel()};
}

}  // namespace

PromptRandom::PromptRandom(uint64_t seed, uint64_t prompt_index) : engine_(mix(mix(seed) ^ prompt_index)) {}

double PromptRandom::next() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

std::vector<int64_t> choose_tokens(const at::Tensor& logits, const Sampling& sampling, const std::vector<double>& uniforms) {
  if (logits.dim() != 2) throw std::invalid_argument("choose_tokens: logits must be [rows, V]");
  // Greedy: the first largest logit, exactly as eval's greedy decoding picks it.
  if (sampling.greedy()) return to_ids(logits.argmax(-1));
  const int64_t rows = logits.size(0);
  if (static_cast<int64_t>(uniforms.size()) != rows)
    throw std::invalid_argument("choose_tokens: " + std::to_string(uniforms.size()) + " draws for " + std::to_string(rows) + " rows");
  // fp64 throughout, so the cumulative sums over a large vocabulary stay exact
  // enough that a draw maps to the token it should.
  at::Tensor probs = (logits.to(at::kDouble) / sampling.temperature).softmax(-1);
  at::Tensor order;  // undefined: vocabulary order
  if (sampling.top_p < 1) {
    // Most likely first (a stable sort: equal probabilities keep vocabulary
    // order, so the result never depends on the sort's implementation).
    auto sorted = probs.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true);
    probs = std::get<0>(sorted);
    order = std::get<1>(sorted);
    // Keep a token while the probability before it is below top_p: the
    // smallest prefix that reaches top_p (never empty).
    const at::Tensor before = probs.cumsum(-1) - probs;
    probs = probs.masked_fill(before.ge(sampling.top_p), 0.0);
  }
  const at::Tensor cumulative = probs.cumsum(-1);
  const at::Tensor draws = at::tensor(uniforms, at::TensorOptions().dtype(at::kDouble)).to(probs.device()).unsqueeze(1);
  // Inverse CDF: the first token whose cumulative probability exceeds u · total.
  at::Tensor index = cumulative.le(draws * cumulative.narrow(1, probs.size(1) - 1, 1)).sum(-1);
  // Rounding can carry the count past the last token of non-zero probability;
  // that token is the right one then.
  const at::Tensor last_positive = (probs.size(1) - 1) - probs.gt(0).flip(-1).to(at::kInt).argmax(-1);
  index = at::minimum(index, last_positive);
  if (order.defined()) index = order.gather(1, index.unsqueeze(1)).squeeze(1);
  return to_ids(index);
}

}  // namespace dflash::generate
