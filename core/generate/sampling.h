// How `dflash-host generate` picks each next token from the target's logits:
// greedy (argmax, eval's rule) or temperature / top-p sampling.
//
// Sampling is reproducible whatever the batch: every prompt draws from its own
// random stream, seeded from (seed, the prompt's index), one draw per token it
// generates. Which prompts share a step, and in which row, never changes a
// prompt's draws. The draw is turned into a token by inverse-CDF sampling on
// the logits' device, so only the chosen ids cross to the host.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <vector>

namespace dflash::generate {

struct Sampling {
  double temperature = 0;  // 0: greedy
  double top_p = 1;        // (0, 1]: sample from the smallest set of most likely tokens whose probability reaches it
  uint64_t seed = 0;
  bool greedy() const { return temperature == 0; }
};

// One prompt's random stream: uniform doubles in [0, 1), 53 random bits each,
// computed here rather than by std::uniform_real_distribution (whose output
// the standard leaves to each library) so a seed means the same on every
// build.
class PromptRandom {
 public:
  PromptRandom(uint64_t seed, uint64_t prompt_index);
  double next();

 private:
  std::mt19937_64 engine_;
};

// The token each row of `logits` [rows, V] picks. `uniforms` holds one draw
// per row, used only when sampling. Rows are independent: a row's choice
// depends on its logits and its draw alone.
std::vector<int64_t> choose_tokens(const at::Tensor& logits, const Sampling& sampling, const std::vector<double>& uniforms);

}  // namespace dflash::generate
