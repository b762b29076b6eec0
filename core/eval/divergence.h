// Where a speculative output first leaves the target's own greedy decoding,
// and whether that is a numerical near-tie or a wrong token.
//
// In bf16 the verification pass (up to block_size tokens at once) and
// target-only decoding (one token per pass) compute the same position's
// logits with different kernel shapes, so with different rounding. Where two
// tokens' logits lie within that rounding of each other the two argmaxes can
// pick different tokens, and from there the outputs differ. A wrong token from
// a broken verification loop has a gap of whole logits. One extra target pass
// over prompt + the common prefix measures the gap between the two candidate
// tokens, in units of the logits' own spacing (docs/eval.md, "Lossless").
#pragma once

#include "plugin/instances.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflash::eval {

// The unit in the last place of `dtype` at |value|: the distance from a value
// of that magnitude to the next representable one. For |value| in
// [2^e, 2^(e+1)): bf16 2^(e-7), fp16 2^(e-10), fp32 2^(e-23), fp64 2^(e-52);
// below the smallest normal number, the subnormal spacing. Throws
// std::invalid_argument for a dtype that is not floating point or a value
// that is not finite.
double logit_spacing(double value, c10::ScalarType dtype);

// The near-tie bound: how many spacings (of the top logit, in the logits'
// dtype) the two candidate tokens' logits may lie apart for a divergence
// between them to count as a near-tie. bf16 and fp16: 8; fp32 and fp64: 128.
// Why those numbers (measured passes, and the gaps of wrong tokens):
// divergence.cpp and docs/eval.md. Throws std::invalid_argument for a dtype
// that is not floating point.
double near_tie_spacings(c10::ScalarType dtype);

// Whether two candidates `gap` apart are a near-tie, `spacing` being the
// logits' spacing at the top logit: gap ≤ near_tie_spacings(dtype) × spacing.
bool is_near_tie(double gap, double spacing, c10::ScalarType dtype);

// "bfloat16", "float16", "float32", "float64" (the config's names).
std::string dtype_name(c10::ScalarType dtype);

// The first position at which two outputs differ, and what the target says there.
struct Divergence {
  int64_t position = 0;  // index into the generated tokens: 0 is the first token after the prompt
  // The tokens there; nullopt where that output ended at `position` and the
  // other goes on (no stopping rule allows that: always a wrong output).
  std::optional<int64_t> speculative_token, greedy_token;
  // Measured by the extra pass (absent where an output ended):
  bool measured = false;
  double speculative_logit = 0, greedy_logit = 0;
  double gap = 0;         // |speculative_logit − greedy_logit|
  double top_logit = 0;   // the largest logit of the position
  int64_t top_token = 0;  // the extra pass's own argmax
  double spacing = 0;     // logit_spacing(top_logit, dtype)
  c10::ScalarType dtype = c10::ScalarType::Float;  // the logits' dtype
  bool near_tie = false;
  std::string note;  // why it is not a near-tie when that is not the gap (an output ended, non-finite logits)

  // The per-prompt report's "divergence" object (docs/eval.md).
  nlohmann::json to_json() const;
};

// The divergence at `position` from the target's logits there ([V], any
// device and floating dtype): the candidates' logits, the gap, the spacing
// and the classification. The extra pass's rows go through this; tests feed
// it constructed rows.
Divergence divergence_at(int64_t position, int64_t speculative_token, int64_t greedy_token, const at::Tensor& logits);

// nullopt when the two outputs are equal. Otherwise finds the first differing
// position i and runs one extra target pass over prompt + the first i tokens
// (its own decode session, ended before returning) for the logits there.
// Nothing of it is timed: call it outside the decodings' clocks.
std::optional<Divergence> find_divergence(const host::TargetModelInstance& target, const std::vector<int64_t>& prompt,
                                          const std::vector<int64_t>& speculative, const std::vector<int64_t>& greedy);

// The report's lossless figures from its per-prompt rows ("identical_to_greedy",
// and "divergence" where an output differs): identical_prompts,
// near_tie_divergences, other_divergences, lossless (every prompt identical),
// lossless_up_to_ties (every other prompt diverged at a near-tie), and, when
// a divergence was measured, near_tie_bound {spacings, dtype}.
nlohmann::json lossless_summary(const nlohmann::json& per_prompt);

// One divergence for the console's per-prompt table, e.g. "at token 51:
// near-tie, gap 0.03125 = 1 bf16 spacing".
std::string divergence_line(const nlohmann::json& divergence);

// The console's lossless verdict from those figures, e.g. "NO: 21 of 32
// identical; the other 11 diverge at near-ties (gap ≤ 8 bf16 spacings); 0
// other divergences".
std::string lossless_line(const nlohmann::json& report);

}  // namespace dflash::eval
