// The chunked gated delta rule's CUDA kernels (plugins/shared/cuda_kernels/
// gated_delta_rule.cu) against hf_hybrid's ATen form (gated_deltanet.cpp, the
// path transformers' fixtures check on the CPU), on the same inputs; and the
// chunk plan the kernels read, on any machine.
//
// Tolerance: the kernels multiply bf16 (or fp16) operands with fp32 sums, as
// flash-linear-attention's kernels do; the reference is fp32 throughout. On
// random layers of Qwen3.6-27B's head shape the relative error (Frobenius) of
// a bf16 run is a few 1e-3; a wrong decay, a state leaking across a
// document, a skipped chunk or a wrong head is of the order of 1.
#include "gated_deltanet.h"

#include <delta_rule_ops.h>
#include <kernel_ops.h>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <cmath>
#include <set>
#include <utility>
#include <vector>

namespace {

namespace gdn = dflash::target::gdn;
namespace ko = dflash::kernel_ops;

constexpr double kRelativeTolerance = 2e-2;

// resets [rows, seq] with a document start at each listed (row, token).
torch::Tensor resets_at(int64_t rows, int64_t seq, const std::vector<std::pair<int64_t, int64_t>>& starts) {
  torch::Tensor r = torch::zeros({rows, seq}, torch::kBool);
  for (const auto& [row, token] : starts) r[row][token] = true;
  return r;
}

TEST(DeltaChunkPlan, CutsEachDocumentIntoItsOwnChunks) {
  // Row 0: documents at 0, 70 and 200 (length 300); row 1: no reset at 0
  // (it continues the initial state), one at 129; row 2: none at all.
  const torch::Tensor resets = resets_at(3, 300, {{0, 0}, {0, 70}, {0, 200}, {1, 129}});
  const ko::DeltaChunkPlan plan = ko::plan_delta_chunks(resets, 3, 300, c10::nullopt);
  std::vector<std::vector<int>> owner(3, std::vector<int>(300, -1));
  for (int64_t c = 0; c < plan.chunk_count(); ++c) {
    const int32_t row = plan.chunks[4 * c], start = plan.chunks[4 * c + 1], length = plan.chunks[4 * c + 2];
    ASSERT_GE(length, 1);
    ASSERT_LE(length, ko::kDeltaRuleChunk);
    for (int32_t t = start; t < start + length; ++t) {
      ASSERT_EQ(owner[row][t], -1) << "token " << t << " of row " << row << " is in two chunks";
      owner[row][t] = static_cast<int>(c);
      if (t > start) EXPECT_FALSE(resets[row][t].item<bool>()) << "chunk " << c << " crosses a document start";
    }
  }
  for (int row = 0; row < 3; ++row)
    for (int t = 0; t < 300; ++t) ASSERT_NE(owner[row][t], -1) << "token " << t << " of row " << row << " has no chunk";

  // Sequences: documents in order, chunks consecutive, flags as stated.
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t i = 0; i < plan.sequence_count(); ++i)
    seqs.push_back({plan.sequences.begin() + 4 * i, plan.sequences.begin() + 4 * i + 4});
  ASSERT_EQ(seqs.size(), 3u + 2u + 1u);
  const std::vector<std::vector<int32_t>> expected_first_tokens = {{0, 70, 200}, {0, 129}, {0}};
  size_t i = 0;
  int32_t next_chunk = 0;
  for (int row = 0; row < 3; ++row) {
    for (size_t d = 0; d < expected_first_tokens[row].size(); ++d, ++i) {
      const auto& s = seqs[i];
      EXPECT_EQ(s[0], row);
      EXPECT_EQ(s[1], next_chunk) << "sequence " << i << "'s chunks are not the next ones";
      EXPECT_EQ(plan.chunks[4 * s[1] + 1], expected_first_tokens[row][d]);
      next_chunk += s[2];
      const bool last = d + 1 == expected_first_tokens[row].size();
      EXPECT_EQ((s[3] & 2) != 0, last) << "sequence " << i;
      EXPECT_EQ((s[3] & 1) != 0, d == 0 && row != 0) << "sequence " << i << ": only a row without a reset at 0 "
                                                        "continues the initial state";
    }
  }
  EXPECT_EQ(next_chunk, plan.chunk_count());
  EXPECT_THROW(ko::plan_delta_chunks(resets, 2, 300, c10::nullopt), std::invalid_argument);
}

TEST(DeltaChunkPlan, RowsWithoutResetsAreOneSequenceEach) {
  const ko::DeltaChunkPlan plan = ko::plan_delta_chunks({}, 2, 130, c10::nullopt);
  EXPECT_EQ(plan.chunk_count(), 6);  // 64 + 64 + 2, twice
  ASSERT_EQ(plan.sequence_count(), 2);
  EXPECT_EQ(plan.sequences[3], 1 | 2);
  EXPECT_EQ(plan.chunks[4 * 2 + 2], 2);
}

struct Layer {
  torch::Tensor mixed, q, k, v, g, beta, initial, resets;
};

// A random layer shaped as the conv output hands it over: q, k, v views of
// one [B, S, C] tensor (strided), g and β as the model forms them.
Layer random_layer(int64_t b, int64_t s, int64_t hk, int64_t hv, int64_t dk, int64_t dv, torch::Dtype dtype,
                   bool with_initial, const torch::Tensor& resets) {
  torch::manual_seed(7);
  const auto on = torch::TensorOptions().device(torch::kCUDA);
  Layer l;
  const int64_t key = hk * dk;
  l.mixed = torch::randn({b, s, 2 * key + hv * dv}, on.dtype(dtype));
  l.q = l.mixed.narrow(2, 0, key).view({b, s, hk, dk});
  l.k = l.mixed.narrow(2, key, key).view({b, s, hk, dk});
  l.v = l.mixed.narrow(2, 2 * key, hv * dv).view({b, s, hv, dv});
  l.g = -torch::rand({b, s, hv}, on.dtype(torch::kFloat)) * 0.6;
  l.beta = torch::rand({b, s, hv}, on.dtype(dtype));
  if (with_initial) l.initial = torch::randn({b, hv, dk, dv}, on.dtype(torch::kFloat)) * 0.1;
  if (resets.defined()) l.resets = resets.to(torch::kCUDA);
  return l;
}

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const torch::Tensor w = want.to(torch::kFloat);
  return ((got.to(torch::kFloat) - w).norm() / w.norm()).item<double>();
}

void expect_kernels_match(int64_t b, int64_t s, int64_t hk, int64_t hv, int64_t dk, int64_t dv, torch::Dtype dtype,
                          bool with_initial, const torch::Tensor& resets) {
  const Layer l = random_layer(b, s, hk, hv, dk, dv, dtype, with_initial, resets);
  ASSERT_TRUE(gdn::kernels_take(l.v, hk, hv, dk, dv));
  const gdn::DeltaOutput got = gdn::chunked_delta_rule(l.q, l.k, l.v, l.g, l.beta, l.resets, l.initial);
  // The reference on the same (rounded) inputs, in fp32.
  const auto f32 = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
  const gdn::DeltaOutput want = gdn::chunked_delta_rule(f32(l.q), f32(l.k), f32(l.v), l.g, f32(l.beta), l.resets,
                                                        l.initial, 64, nullptr, /*reference=*/true);
  ASSERT_EQ(got.out.sizes(), want.out.sizes());
  ASSERT_EQ(got.out.scalar_type(), dtype);
  EXPECT_LT(relative_error(got.out, want.out), kRelativeTolerance);
  EXPECT_LT(relative_error(got.state, want.state), kRelativeTolerance);
  // Token by token too: no document or chunk may be off while the rest holds.
  const torch::Tensor per_token = (got.out.to(torch::kFloat) - want.out).flatten(2).norm(2, -1) /
                                  want.out.flatten(2).norm(2, -1).clamp_min(1e-3);
  EXPECT_LT(per_token.max().item<double>(), 10 * kRelativeTolerance);
}

#define SKIP_WITHOUT_KERNELS()                                                           \
  do {                                                                                   \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";                  \
    if (!gdn::kernels_take(torch::zeros({1}, torch::TensorOptions().device(torch::kCUDA) \
                                                 .dtype(torch::kBFloat16)),              \
                           1, 1, 128, 128))                                              \
      GTEST_SKIP() << "this build has no CUDA kernels";                                  \
  } while (0)

TEST(DeltaRuleCuda, MatchesTheReferenceAtQwen36Heads) {
  SKIP_WITHOUT_KERNELS();
  // Qwen3.6-27B's head dims and grouping (16 key heads, 48 value heads there;
  // 2 and 6 here), three rows of 300 tokens: whole and partial chunks.
  expect_kernels_match(3, 300, 2, 6, 128, 128, torch::kBFloat16, false, {});
}

TEST(DeltaRuleCuda, PackedDocumentsAndInitialState) {
  SKIP_WITHOUT_KERNELS();
  // Documents starting mid-chunk, a row continuing its initial state, a
  // one-token document.
  const torch::Tensor resets = resets_at(3, 260, {{0, 0}, {0, 37}, {0, 200}, {1, 64}, {1, 65}, {2, 0}});
  expect_kernels_match(3, 260, 2, 6, 128, 128, torch::kBFloat16, true, resets);
}

TEST(DeltaRuleCuda, OddHeadDimsAndHalfPrecision) {
  SKIP_WITHOUT_KERNELS();
  // Head dims that are not multiples of 16 (the fixtures' tiny models),
  // more than 64 value columns (two column blocks), and fp16.
  const torch::Tensor resets = resets_at(2, 150, {{0, 0}, {0, 90}, {1, 0}});
  expect_kernels_match(2, 150, 1, 3, 12, 40, torch::kBFloat16, true, resets);
  expect_kernels_match(2, 150, 2, 2, 72, 100, torch::kHalf, false, resets);
}

TEST(DeltaRuleCuda, OneTokenRowsAndAPlanBuiltOnce) {
  SKIP_WITHOUT_KERNELS();
  expect_kernels_match(4, 1, 1, 2, 128, 128, torch::kBFloat16, true, {});
  // A plan passed in is the one used: the same result as one built inside.
  const torch::Tensor resets = resets_at(2, 100, {{0, 0}, {0, 50}});
  const Layer l = random_layer(2, 100, 1, 2, 128, 128, torch::kBFloat16, false, resets);
  const ko::DeltaChunkPlan plan = ko::plan_delta_chunks(l.resets, 2, 100, l.v.device());
  const auto a = gdn::chunked_delta_rule(l.q, l.k, l.v, l.g, l.beta, l.resets, {}, 64, &plan);
  const auto b = gdn::chunked_delta_rule(l.q, l.k, l.v, l.g, l.beta, l.resets, {});
  EXPECT_TRUE(torch::equal(a.out, b.out));
  // A plan of other rows is refused, not read out of bounds.
  const ko::DeltaChunkPlan wrong = ko::plan_delta_chunks({}, 2, 99, l.v.device());
  EXPECT_THROW(gdn::chunked_delta_rule(l.q, l.k, l.v, l.g, l.beta, l.resets, {}, 64, &wrong), std::invalid_argument);
}

}  // namespace

// ---- The layer's other kernels (one pass each) against the ATen arithmetic
// they replace, on the same bf16 inputs: equal but for fp32 summation order
// (a bf16 rounding step at most, on a few elements).

double max_ulp_gap(const torch::Tensor& got, const torch::Tensor& want) {
  // The largest |got − want| in units of want's bf16 spacing (2^-7 of its
  // magnitude), that spacing floored at 1 % of the largest magnitude's (a
  // sum that cancels to near zero keeps fp32's error of its terms).
  const torch::Tensor w = want.to(torch::kFloat), g = got.to(torch::kFloat);
  const double ulp = std::ldexp(1.0, -7);
  return ((g - w).abs() / (w.abs() * ulp).clamp_min(1e-2 * ulp * w.abs().max().item<double>())).max().item<double>();
}

TEST(DeltaRuleCuda, CausalConvMatchesTheAtenForm) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(3);
  const auto on = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  // x a strided view (the projection's first columns), documents mid-row, a
  // window before the rows; rows longer than one thread's 32-token tile.
  // Strides of 113 take the one-channel path; 104 and 64 the 8-channel one.
  // (Every case needs seq > 32: the document starts below reach token 32.)
  struct Case {
    int64_t channels, extra_columns, taps, seq;
  };
  for (const Case c : {Case{96, 17, 4, 40}, Case{96, 8, 4, 70}, Case{64, 0, 3, 33}, Case{64, 0, 1, 40}}) {
    SCOPED_TRACE("channels " + std::to_string(c.channels) + " + " + std::to_string(c.extra_columns) + ", " +
                 std::to_string(c.taps) + " taps, " + std::to_string(c.seq) + " tokens");
    const torch::Tensor projected = torch::randn({3, c.seq, c.channels + c.extra_columns}, on);
    const torch::Tensor x = projected.narrow(2, 0, c.channels);
    const torch::Tensor weight = torch::randn({c.channels, c.taps}, on) * 0.5;
    const torch::Tensor prefix = torch::randn({3, c.taps - 1, c.channels}, on);
    const torch::Tensor resets =
        resets_at(3, c.seq, {{0, 0}, {0, 2}, {0, c.seq - 10}, {1, 17}, {2, 31}, {2, 32}}).to(torch::kCUDA);
    const torch::Tensor got = gdn::causal_conv(x, weight, resets, prefix);
    // The ATen form: fp32 inputs (runs_on is false), the output rounded as
    // conv1d rounds, SiLU rounded again.
    const torch::Tensor want =
        gdn::causal_conv(x.to(torch::kFloat), weight.to(torch::kFloat), resets, prefix.to(torch::kFloat));
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LT(max_ulp_gap(got, want), 2.01) << "off by more than a rounding";
    // Document starts read no earlier tokens: row 0's token 2 sees itself only.
    const torch::Tensor alone =
        torch::silu((x[0][2].to(torch::kFloat) * weight.select(1, c.taps - 1).to(torch::kFloat)));
    EXPECT_TRUE(torch::allclose(got[0][2].to(torch::kFloat), alone, 1e-2, 1e-2));
    // Without documents or a window: the plain causal conv from zeros.
    const torch::Tensor plain = gdn::causal_conv(x, weight, torch::Tensor(), torch::Tensor());
    const torch::Tensor plain_want =
        gdn::causal_conv(x.to(torch::kFloat), weight.to(torch::kFloat), torch::Tensor(), torch::Tensor());
    EXPECT_LT(max_ulp_gap(plain, plain_want), 2.01);
  }
}

TEST(DeltaRuleCuda, NormKernelsMatchTheAtenForm) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(4);
  const auto on = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  // The (1 + w) RMSNorm: x̂ · scale in fp32, rounded once.
  const torch::Tensor x = torch::randn({37, 520}, on) * 3;
  const torch::Tensor scale = torch::randn({520}, on.dtype(torch::kFloat)) * 0.1 + 1;
  const torch::Tensor f = x.to(torch::kFloat);
  const torch::Tensor want = (f * torch::rsqrt(f.pow(2).mean(-1, true) + 1e-6) * scale).to(torch::kBFloat16);
  EXPECT_LT(max_ulp_gap(ko::rms_norm_scaled(x, scale, 1e-6), want), 1.01);
  // The gated norm: z a strided view, 3 heads of 40.
  const torch::Tensor core = torch::randn({29, 3, 40}, on);
  const torch::Tensor projected = torch::randn({29, 120 + 8}, on);
  const torch::Tensor z = projected.narrow(1, 8, 120);
  const torch::Tensor w = torch::randn({40}, on);
  const torch::Tensor c = core.to(torch::kFloat);
  const torch::Tensor normed = w * (c * torch::rsqrt(c.pow(2).mean(-1, true) + 1e-6)).to(torch::kBFloat16);
  const torch::Tensor gated = (normed * torch::silu(z.view({29, 3, 40}).to(torch::kFloat))).to(torch::kBFloat16);
  EXPECT_LT(max_ulp_gap(ko::gated_rms_norm(core, z, w, 1e-6), gated.view({29, 120})), 2.01);
}

// ---- The recurrent form's kernel (decoding steps).

TEST(DeltaRuleCuda, RecurrentKernelMatchesTheAtenLoopAndIsCutAndRowInvariant) {
  SKIP_WITHOUT_KERNELS();
  // Three sessions of a 9-token step, Qwen3.6's head dims, from states.
  const Layer l = random_layer(3, 9, 2, 6, 128, 128, torch::kBFloat16, true, {});
  const gdn::DeltaOutput got = gdn::recurrent_delta_rule(l.q, l.k, l.v, l.g, l.beta, l.initial);
  const auto f32 = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
  const gdn::DeltaOutput want =
      gdn::recurrent_delta_rule(f32(l.q), f32(l.k), f32(l.v), l.g, f32(l.beta), l.initial, /*reference=*/true);
  EXPECT_LT(relative_error(got.out, want.out), 1e-2) << "bf16 outputs of fp32 arithmetic";
  EXPECT_LT(relative_error(got.state, want.state), 1e-5) << "the state is fp32 throughout";
  // Cut at token 4 and resumed: bitwise the state and outputs of one call.
  const auto first = [](const torch::Tensor& t, int64_t n) { return t.narrow(1, 0, n); };
  const auto rest = [](const torch::Tensor& t, int64_t n) { return t.narrow(1, n, t.size(1) - n); };
  const gdn::DeltaOutput a = gdn::recurrent_delta_rule(first(l.q, 4), first(l.k, 4), first(l.v, 4), first(l.g, 4),
                                                       first(l.beta, 4), l.initial);
  const gdn::DeltaOutput b = gdn::recurrent_delta_rule(rest(l.q, 4), rest(l.k, 4), rest(l.v, 4), rest(l.g, 4),
                                                       rest(l.beta, 4), a.state);
  EXPECT_TRUE(torch::equal(b.state, got.state));
  EXPECT_TRUE(torch::equal(torch::cat({a.out, b.out}, 1), got.out));
  // One session alone: bitwise its row of the batch.
  const auto row1 = [](const torch::Tensor& t) { return t.narrow(0, 1, 1); };
  const gdn::DeltaOutput alone =
      gdn::recurrent_delta_rule(row1(l.q), row1(l.k), row1(l.v), row1(l.g), row1(l.beta), row1(l.initial));
  EXPECT_TRUE(torch::equal(alone.state, row1(got.state)));
  EXPECT_TRUE(torch::equal(alone.out, row1(got.out)));
  // Odd head dims (the fixtures' tiny models).
  const Layer odd = random_layer(2, 5, 1, 3, 12, 40, torch::kBFloat16, true, {});
  const gdn::DeltaOutput odd_got = gdn::recurrent_delta_rule(odd.q, odd.k, odd.v, odd.g, odd.beta, odd.initial);
  const gdn::DeltaOutput odd_want = gdn::recurrent_delta_rule(f32(odd.q), f32(odd.k), f32(odd.v), odd.g, f32(odd.beta),
                                                              odd.initial, true);
  EXPECT_LT(relative_error(odd_got.state, odd_want.state), 1e-5);
}
