#include "eval/divergence.h"

#include <dflash/sdk/torch.hpp>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>

namespace dflash::eval {
namespace {

// A floating format's explicit mantissa bits and the exponent of its smallest
// normal number.
struct FloatFormat {
  int mantissa_bits;
  int min_exponent;
};

std::optional<FloatFormat> format_of(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::BFloat16: return FloatFormat{7, -126};
    case c10::ScalarType::Half: return FloatFormat{10, -14};
    case c10::ScalarType::Float: return FloatFormat{23, -126};
    case c10::ScalarType::Double: return FloatFormat{52, -1022};
    default: return std::nullopt;
  }
}

FloatFormat require_format(c10::ScalarType dtype) {
  if (auto f = format_of(dtype)) return *f;
  throw std::invalid_argument(std::string("logits of dtype ") + c10::toString(dtype) +
                              " have no spacing: the target's logits must be bfloat16, float16, float32 or float64");
}

// The short name the console uses: "bf16 spacings".
std::string short_name(const std::string& dtype) {
  if (dtype == "bfloat16") return "bf16";
  if (dtype == "float16") return "fp16";
  if (dtype == "float32") return "fp32";
  if (dtype == "float64") return "fp64";
  return dtype;
}

std::string number(double value, const char* format) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

}  // namespace

double logit_spacing(double value, c10::ScalarType dtype) {
  const FloatFormat f = require_format(dtype);
  if (!std::isfinite(value)) throw std::invalid_argument("logit_spacing: the logit " + number(value, "%g") + " is not finite");
  int e = f.min_exponent;  // zero and subnormals: the spacing of the smallest binade
  if (value != 0) {
    int exponent = 0;
    std::frexp(std::fabs(value), &exponent);  // |value| = m · 2^exponent, m in [0.5, 1)
    e = std::max(exponent - 1, f.min_exponent);  // |value| in [2^e, 2^(e+1))
  }
  return std::ldexp(1.0, e - f.mantissa_bits);
}

// The bound has to cover how far two passes of different shapes move the
// difference between two logits, and stay below the gap of a wrong token.
// Measured on the quickstart target on the CPU (6 layers, 128 held-out
// prompts × 128 greedy tokens = 16,384 positions): each position's logits from
// the one-token pass, from 16-token verification-shaped passes and from one
// prefill over the whole sequence.
// - bf16: the difference between the top two logits moved by 0 spacings of
//   the top logit at 54 % of positions, 1 at 38 %, 2 at 6.6 %, 3 at 0.8 %,
//   4–9 at 0.2 % (36 positions; at most 9). It is accumulated rounding of the
//   whole network, not one rounding: a different GEMM shape flips a few
//   hidden elements' bf16 rounding and that propagates. At the 43 positions
//   where the passes' argmaxes differed, the verification pass's gap was at
//   most 4 spacings. Against that, the tokens an off-by-one verification bug
//   would emit (the greedy token of the neighbouring position) lie within 8
//   spacings of the top logit at 0.85 % of 22,692 positions, within 4 at
//   0.49 %; at |logit| ≈ 10, 8 spacings are half a logit. So 8: twice the
//   largest gap at an observed flip, and a bug's wrong token almost never
//   meets it. fp16 rounds every op's output to a 16-bit format like bf16
//   (the CPU has no fp16 GEMM to measure it on): the same 8.
// - fp32: nothing rounds to a coarser format between ops, so the two passes'
//   accumulation orders show in full: the top-two difference moved by up to
//   58 fp32 spacings (median 3), with no argmax flip. 128 covers that twice;
//   at |logit| ≈ 10 it is 1.2e-4 logits, and no neighbouring token came within
//   32 spacings. fp64: the same count.
double near_tie_spacings(c10::ScalarType dtype) {
  require_format(dtype);
  return dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half ? 8.0 : 128.0;
}

bool is_near_tie(double gap, double spacing, c10::ScalarType dtype) {
  return std::isfinite(gap) && std::isfinite(spacing) && gap <= near_tie_spacings(dtype) * spacing;
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    default: return c10::toString(dtype);
  }
}

nlohmann::json Divergence::to_json() const {
  auto token = [](const std::optional<int64_t>& t) { return t ? nlohmann::json(*t) : nlohmann::json(nullptr); };
  nlohmann::json j = {{"position", position},
                      {"speculative_token", token(speculative_token)},
                      {"greedy_token", token(greedy_token)},
                      {"near_tie", near_tie}};
  if (measured) {
    const std::string prefers = speculative_logit > greedy_logit   ? "speculative"
                                : speculative_logit < greedy_logit ? "greedy"
                                                                   : "equal";
    j.update({{"speculative_logit", speculative_logit},
              {"greedy_logit", greedy_logit},
              {"gap", gap},
              {"top_logit", top_logit},
              {"top_token", top_token},
              {"spacing", spacing},
              {"gap_spacings", spacing > 0 ? gap / spacing : NAN},
              {"dtype", dtype_name(dtype)},
              {"extra_pass_prefers", prefers}});
  }
  if (!note.empty()) j["note"] = note;
  return j;
}

Divergence divergence_at(int64_t position, int64_t speculative_token, int64_t greedy_token, const at::Tensor& logits) {
  if (logits.dim() != 1)
    throw std::invalid_argument("divergence_at: the logits must be one position's row [vocab], not of shape " +
                                c10::str(logits.sizes()));
  const int64_t vocab = logits.size(0);
  for (int64_t token : {speculative_token, greedy_token})
    if (token < 0 || token >= vocab)
      throw std::invalid_argument("divergence_at: token " + std::to_string(token) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
  require_format(logits.scalar_type());
  Divergence d;
  d.position = position;
  d.speculative_token = speculative_token;
  d.greedy_token = greedy_token;
  d.dtype = logits.scalar_type();
  d.measured = true;
  // Every value of the logits' dtype is exact in double.
  const at::Tensor row = logits.detach().to(at::kCPU, at::kDouble).contiguous();
  const double* v = row.data_ptr<double>();
  d.speculative_logit = v[speculative_token];
  d.greedy_logit = v[greedy_token];
  d.top_token = row.argmax().item<int64_t>();  // the first of equal maxima, as the decodings' argmax
  d.top_logit = v[d.top_token];
  d.gap = std::fabs(d.speculative_logit - d.greedy_logit);
  if (!std::isfinite(d.speculative_logit) || !std::isfinite(d.greedy_logit) || !std::isfinite(d.top_logit)) {
    d.spacing = NAN;
    d.note = "the target's logits there are not finite";
    return d;
  }
  d.spacing = logit_spacing(d.top_logit, d.dtype);
  d.near_tie = is_near_tie(d.gap, d.spacing, d.dtype);
  return d;
}

std::optional<Divergence> find_divergence(const host::TargetModelInstance& target, const std::vector<int64_t>& prompt,
                                          const std::vector<int64_t>& speculative, const std::vector<int64_t>& greedy) {
  const size_t common = std::min(speculative.size(), greedy.size());
  size_t i = 0;
  while (i < common && speculative[i] == greedy[i]) ++i;
  if (i == common && speculative.size() == greedy.size()) return std::nullopt;
  if (i == common) {
    // Equal prefixes stop at the same token under the one stopping rule, so
    // one output ending where the other goes on is a wrong output, not rounding.
    Divergence d;
    d.position = static_cast<int64_t>(i);
    if (i < speculative.size()) d.speculative_token = speculative[i];
    if (i < greedy.size()) d.greedy_token = greedy[i];
    d.note = std::string(i < speculative.size() ? "the greedy" : "the speculative") +
             " output ends here and the other goes on, after the same tokens: not a rounding tie";
    return d;
  }
  std::vector<int64_t> context = prompt;
  context.insert(context.end(), speculative.begin(), speculative.begin() + static_cast<std::ptrdiff_t>(i));
  const c10::NoGradGuard no_grad;
  const int64_t session = target.decode_begin(static_cast<int64_t>(context.size()));
  struct End {
    std::function<void()> end;
    ~End() { end(); }
  } end{[&] { target.decode_end(session); }};
  const at::Tensor ids = at::tensor(c10::ArrayRef<int64_t>(context), at::kLong);
  const at::Tensor logits =
      host::require_tensor(target.decode_extend(session, ids, {}, true), "logits", target.record().label() + ": decode_extend");
  return divergence_at(static_cast<int64_t>(i), speculative[i], greedy[i], logits.select(0, logits.size(0) - 1));
}

nlohmann::json lossless_summary(const nlohmann::json& per_prompt) {
  int64_t prompts = 0, identical = 0, near_ties = 0, others = 0;
  nlohmann::json bound;
  for (const auto& row : per_prompt) {
    ++prompts;
    if (row.value("identical_to_greedy", false)) {
      ++identical;
      continue;
    }
    const nlohmann::json divergence = row.value("divergence", nlohmann::json());
    const bool tie = divergence.is_object() && divergence.value("near_tie", false);
    ++(tie ? near_ties : others);
    if (bound.is_null() && divergence.is_object() && divergence.contains("dtype")) {
      const std::string dtype = divergence.at("dtype").get<std::string>();
      bound = {{"spacings", near_tie_spacings(sdk::parse_dtype(dtype))}, {"dtype", dtype}};
    }
  }
  nlohmann::json summary = {{"identical_prompts", identical},
                            {"near_tie_divergences", near_ties},
                            {"other_divergences", others},
                            {"lossless", identical == prompts},
                            {"lossless_up_to_ties", others == 0}};
  if (!bound.is_null()) summary["near_tie_bound"] = bound;
  return summary;
}

std::string divergence_line(const nlohmann::json& d) {
  std::string line = "at token " + d.at("position").dump() + ": " + (d.value("near_tie", false) ? "near-tie" : "NOT a near-tie");
  if (d.contains("gap_spacings") && d.at("gap_spacings").is_number()) {
    const double spacings = d.at("gap_spacings").get<double>();
    line += ", gap " + number(d.at("gap").get<double>(), "%.4g") + " = " + number(spacings, "%.3g") + " " +
            short_name(d.at("dtype").get<std::string>()) + (spacings == 1 ? " spacing" : " spacings");
  }
  if (d.contains("note")) line += "; " + d.at("note").get<std::string>();
  return line;
}

std::string lossless_line(const nlohmann::json& r) {
  const int64_t prompts = static_cast<int64_t>(r.at("per_prompt").size());
  const int64_t identical = r.at("identical_prompts").get<int64_t>();
  if (r.at("lossless").get<bool>())
    return "yes (" + std::to_string(identical) + " of " + std::to_string(prompts) +
           " outputs identical to the target's greedy decoding)";
  const int64_t ties = r.value("near_tie_divergences", int64_t{0}), others = r.value("other_divergences", prompts - identical);
  std::string bound = "gap within the near-tie bound";
  if (r.contains("near_tie_bound")) {
    const auto& b = r.at("near_tie_bound");
    bound = "gap ≤ " + number(b.at("spacings").get<double>(), "%g") + " " + short_name(b.at("dtype").get<std::string>()) +
            " spacings";
  }
  std::string line = "NO: " + std::to_string(identical) + " of " + std::to_string(prompts) + " identical; ";
  line += (others == 0 ? "the other " : "") + std::to_string(ties) + (ties == 1 ? " diverges" : " diverge") +
          " at near-ties (" + bound + "); " + std::to_string(others) + (others == 1 ? " other divergence" : " other divergences");
  line += others == 0 ? ": lossless up to rounding ties" : ": wrong tokens, not rounding (see per_prompt divergence)";
  return line;
}

}  // namespace dflash::eval
