#include "gated_deltanet.h"

#include <kernel_ops.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::target::gdn {
namespace {

// Index of each token within its document, [B, S] int64; a very large value
// where a row has no reset before the token (the window reaches back into the
// prefix or the carried state).
at::Tensor position_in_document(const at::Tensor& resets, int64_t b, int64_t s, const at::TensorOptions& options) {
  const at::Tensor index = at::arange(s, options.dtype(at::kLong)).expand({b, s});
  if (!resets.defined()) return at::full({b, s}, std::numeric_limits<int32_t>::max(), options.dtype(at::kLong));
  // The last reset at or before each token; -1 where there is none yet.
  const at::Tensor marked = at::where(resets, index, at::full_like(index, -1));
  const at::Tensor start = std::get<0>(at::cummax(marked, 1));
  return at::where(start.ge(0), index - start, at::full_like(index, std::numeric_limits<int32_t>::max()));
}

// x · rsqrt(Σx² + eps) over the last dimension (FLA's and transformers' l2norm).
at::Tensor l2norm(const at::Tensor& x) { return x * at::rsqrt((x * x).sum(-1, true) + 1e-6); }

// The inverse of the unit lower-triangular T = I + strictly-lower(a), for
// [..., C, C] with C a power of two, built bottom-up by 2 × 2 blocks: with
// T's diagonal blocks A and D and lower-left block L, T⁻¹'s lower-left is
// −D⁻¹ L A⁻¹. Every block of one size is formed at once (one pair of batched
// GEMMs per level, log2 C levels), instead of a batched triangular solve
// per right-hand side, which runs far from the GEMM rate on small systems.
// Only a's strictly lower part is read, as a unitriangular solve reads it.
at::Tensor unit_lower_inverse(const at::Tensor& a) {
  const int64_t c = a.size(-1);
  at::Tensor inverse = at::eye(c, a.options()).expand(a.sizes()).clone();
  std::vector<int64_t> blocks(a.sizes().begin(), a.sizes().end() - 2);
  for (int64_t b = 1; b < c; b *= 2) {
    // The diagonal 2b × 2b blocks of both, [..., C/2b, 2b, 2b] (views).
    std::vector<int64_t> shape = blocks;
    for (int64_t d : {c / (2 * b), 2 * b, c / (2 * b), 2 * b}) shape.push_back(d);
    auto diagonal = [&](const at::Tensor& t) { return t.view(shape).diagonal(0, -4, -2).movedim(-1, -3); };
    const at::Tensor of_inverse = diagonal(inverse), of_a = diagonal(a);
    const at::Tensor upper_left = of_inverse.narrow(-2, 0, b).narrow(-1, 0, b);
    const at::Tensor lower_right = of_inverse.narrow(-2, b, b).narrow(-1, b, b);
    const at::Tensor lower_left = of_a.narrow(-2, b, b).narrow(-1, 0, b);
    of_inverse.narrow(-2, b, b).narrow(-1, 0, b).copy_(-at::matmul(at::matmul(lower_right, lower_left), upper_left));
  }
  return inverse;
}

// [B, S, H, d] → [B, H, S, d] fp32, key heads repeated to the value heads.
at::Tensor heads_first(const at::Tensor& x, int64_t value_heads) {
  at::Tensor t = x;
  if (t.size(2) != value_heads) t = t.repeat_interleave(value_heads / t.size(2), 2);
  return t.transpose(1, 2).to(at::kFloat).contiguous();
}

}  // namespace

at::Tensor causal_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& resets,
                       const at::Tensor& prefix) {
  const int64_t b = x.size(0), s = x.size(1), c = x.size(2), taps = weight.size(1);
  if (kernel_ops::runs_on(x) && taps <= 8)  // the same arithmetic in one pass (cuda_kernels.h)
    return kernel_ops::causal_conv_silu(x, weight, prefix,
                                        resets.defined() ? position_in_document(resets, b, s, x.options()) : at::Tensor());
  const at::Tensor window = prefix.defined() ? prefix.to(x.scalar_type()) : at::zeros({b, taps - 1, c}, x.options());
  const at::Tensor padded = at::cat({window, x}, 1);  // [B, K-1+S, C]
  // The whole rows through one depthwise conv1d, as transformers'
  // causal_conv1d_fn runs it (its arithmetic, and cuDNN's speed on the GPU).
  const std::vector<int64_t> one{1}, none{0};
  at::Tensor out = at::conv1d(padded.transpose(1, 2), weight.unsqueeze(1), /*bias=*/at::Tensor(), at::IntArrayRef(one),
                              /*padding=*/at::IntArrayRef(none), /*dilation=*/at::IntArrayRef(one), /*groups=*/c)
                       .transpose(1, 2)
                       .contiguous();
  if (resets.defined()) {
    // A document's first K-1 tokens must not read the document before them:
    // only those tokens are recomputed, their window's taps from before the
    // document dropped (summed in fp32 and rounded once, as conv1d does).
    const at::Tensor in_document = position_in_document(resets, b, s, x.options());
    // A row's first K-1 tokens read the window before the row: zeros (no
    // fix-up needed) unless a prefix was given.
    at::Tensor near_start = in_document.lt(taps - 1);
    if (!prefix.defined()) near_start = near_start.logical_and(at::arange(s, in_document.options()).ge(taps - 1));
    const at::Tensor where = near_start.nonzero();  // [M, 2] (row, token)
    if (where.size(0) > 0) {
      const at::Tensor row = where.select(1, 0), token = where.select(1, 1);
      const at::Tensor tap = at::arange(taps, token.options());
      // padded[row, token + j] is tap j's input for output `token`.
      const at::Tensor inputs = padded.index({row.unsqueeze(1), token.unsqueeze(1) + tap});  // [M, K, C]
      const at::Tensor kept = in_document.index({row, token}).unsqueeze(1).ge(taps - 1 - tap);  // [M, K]
      const at::Tensor fixed = (inputs.to(at::kFloat) * weight.to(at::kFloat).t().unsqueeze(0) *
                                kept.unsqueeze(-1).to(at::kFloat))
                                   .sum(1)
                                   .to(x.scalar_type());  // [M, C]
      out.index_put_({row, token}, fixed);
    }
  }
  return at::silu(out);
}

bool kernels_take(const at::Tensor& like, int64_t key_heads, int64_t value_heads, int64_t dk, int64_t dv,
                  int64_t chunk) {
  return chunk == kernel_ops::kDeltaRuleChunk && kernel_ops::delta_rule_fits(like, key_heads, value_heads, dk, dv);
}

DeltaOutput chunked_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                               const at::Tensor& g_in, const at::Tensor& beta_in, const at::Tensor& resets_in,
                               const at::Tensor& initial, int64_t chunk, const kernel_ops::DeltaChunkPlan* plan,
                               bool reference) {
  if (chunk < 1 || (chunk & (chunk - 1)) != 0)
    throw std::invalid_argument("chunked_delta_rule: chunk " + std::to_string(chunk) + " is not a power of two");
  const int64_t b = v_in.size(0), s = v_in.size(1), heads = v_in.size(2), dv = v_in.size(3), dk = k_in.size(3);
  if (!reference && kernels_take(v_in, k_in.size(2), heads, dk, dv, chunk)) {
    const kernel_ops::DeltaChunkPlan own = plan != nullptr ? kernel_ops::DeltaChunkPlan{}
                                                           : kernel_ops::plan_delta_chunks(resets_in, b, s, v_in.device());
    kernel_ops::DeltaRuleResult r =
        kernel_ops::chunked_gated_delta_rule(q_in, k_in, v_in, g_in, beta_in, initial, plan != nullptr ? *plan : own);
    return DeltaOutput{std::move(r.out), std::move(r.state)};
  }
  const auto f32 = v_in.options().dtype(at::kFloat);
  at::Tensor q = l2norm(heads_first(q_in, heads)) * (1.0 / std::sqrt(static_cast<double>(dk)));  // [B, H, S, dk]
  at::Tensor k = l2norm(heads_first(k_in, heads));
  at::Tensor v = v_in.transpose(1, 2).to(at::kFloat).contiguous();         // [B, H, S, dv]
  at::Tensor beta = beta_in.transpose(1, 2).to(at::kFloat).contiguous();   // [B, H, S]
  at::Tensor g = g_in.transpose(1, 2).to(at::kFloat).contiguous();

  // Pad to whole chunks: padding tokens have k = v = β = g = 0, so they
  // change no state, and their outputs are dropped.
  const int64_t pad = (chunk - s % chunk) % chunk, total = s + pad, chunks = total / chunk;
  at::Tensor resets = resets_in.defined() ? resets_in : at::zeros({b, s}, v_in.options().dtype(at::kBool));
  if (pad > 0) {
    q = at::constant_pad_nd(q, {0, 0, 0, pad});
    k = at::constant_pad_nd(k, {0, 0, 0, pad});
    v = at::constant_pad_nd(v, {0, 0, 0, pad});
    beta = at::constant_pad_nd(beta, {0, pad});
    g = at::constant_pad_nd(g, {0, pad});
    resets = at::cat({resets, at::zeros({b, pad}, resets.options())}, 1);
  }
  auto chunked = [&](const at::Tensor& t) {  // [B, H, T, ...] → [B, H, N, C, ...]
    std::vector<int64_t> shape{b, heads, chunks, chunk};
    for (int64_t d = 3; d < t.dim(); ++d) shape.push_back(t.size(d));
    return t.reshape(shape);
  };

  // Documents inside each chunk: a segment runs from the chunk's start or a
  // reset to the next reset. Token i of a chunk sees token j (j ≤ i) only in
  // the same segment; the state carried into the chunk reaches only the
  // tokens of a segment that began before it (`continues`).
  const at::Tensor reset_chunks = resets.view({b, chunks, chunk});             // [B, N, C]
  const at::Tensor segment = reset_chunks.to(at::kLong).cumsum(-1);            // 0 until the chunk's first reset
  const at::Tensor continues = segment.eq(0);                                   // [B, N, C]
  const at::Tensor same = segment.unsqueeze(-1).eq(segment.unsqueeze(-2));     // [B, N, C, C]
  const at::Tensor lower = at::ones({chunk, chunk}, resets.options()).tril();
  const at::Tensor visible = same.logical_and(lower).unsqueeze(1);             // [B, 1, N, C, C]

  // Cumulative log decay from each token's segment start, summed in fp64 so
  // that a segment starting mid-chunk loses nothing to the sums before it.
  const at::Tensor g_chunks = chunked(g).to(at::kDouble);                       // [B, H, N, C]
  const at::Tensor running = g_chunks.cumsum(-1);
  const at::Tensor index = at::arange(chunk, resets.options().dtype(at::kLong)).expand({b, chunks, chunk});
  const at::Tensor segment_start = std::get<0>(
      at::cummax(at::where(reset_chunks, index, at::zeros_like(index)), -1));  // [B, N, C]
  const at::Tensor start_index = segment_start.unsqueeze(1).expand({b, heads, chunks, chunk});
  const at::Tensor before = (running - g_chunks).gather(-1, start_index);
  const at::Tensor decay = (running - before).to(at::kFloat);                  // [B, H, N, C], ≤ 0

  // From here on each fp32 [B, H, S, d] tensor is released once its last use
  // is past, so that no more than five of them (and three of the
  // [B, H, S, C] chunk matrices) are alive at once: the forward's peak is
  // this function's (plan_hybrid_memory counts each stage's alive set).
  at::Tensor qc = chunked(q), kc = chunked(k);
  q.reset();
  k.reset();
  const at::Tensor carried = continues.unsqueeze(1).to(at::kFloat);            // [B, 1, N, C]
  const at::Tensor reads_carried = (decay.exp() * carried).unsqueeze(-1);      // [B, H, N, C, 1]
  at::Tensor pair = (decay.unsqueeze(-1) - decay.unsqueeze(-2))
                        .masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity())
                        .exp();                                                // [B, H, N, C, C]
  at::Tensor new_values, k_cumdecay;
  {
    // The UT transform: T = I + strictly-lower(diag(β) K Kᵀ ⊙ decay), its
    // inverse applied to β·v and to the decayed β·k (transformers solves the
    // same unitriangular systems; FLA forms the inverse too).
    const at::Tensor bc = chunked(beta).unsqueeze(-1);
    at::Tensor k_beta = kc * bc;
    at::Tensor inverse = unit_lower_inverse(at::matmul(k_beta, kc.transpose(-1, -2)).mul_(pair));
    at::Tensor v_beta = chunked(v).mul(bc);
    v.reset();
    new_values = at::matmul(inverse, v_beta);
    v_beta.reset();
    k_cumdecay = at::matmul(inverse, k_beta.mul_(reads_carried));
  }
  const at::Tensor intra = at::matmul(qc, kc.transpose(-1, -2)).mul_(pair);    // [B, H, N, C, C]
  pair.reset();
  const at::Tensor q_read = qc.mul_(reads_carried);                            // reads the carried state
  qc.reset();
  // The state passed on: decays from each token to the chunk's end, for
  // tokens in the chunk's last segment only.
  const at::Tensor last = decay.narrow(-1, chunk - 1, 1);                      // [B, H, N, 1]
  const at::Tensor in_last = same.select(-1, chunk - 1).unsqueeze(1).to(at::kFloat);  // [B, 1, N, C]
  const at::Tensor k_write = kc.mul_(((last - decay).exp() * in_last).unsqueeze(-1));
  kc.reset();
  const at::Tensor chunk_decay = (last.squeeze(-1).exp() * carried.select(-1, chunk - 1)).unsqueeze(-1).unsqueeze(-1);

  at::Tensor state = initial.defined() ? initial.to(f32).clone() : at::zeros({b, heads, dk, dv}, f32);
  at::Tensor out = at::empty({b, heads, chunks, chunk, dv}, f32);
  for (int64_t i = 0; i < chunks; ++i) {
    const at::Tensor v_new = new_values.select(2, i) - at::matmul(k_cumdecay.select(2, i), state);
    out.select(2, i).copy_(at::matmul(q_read.select(2, i), state) + at::matmul(intra.select(2, i), v_new));
    state = state * chunk_decay.select(2, i) + at::matmul(k_write.select(2, i).transpose(-1, -2), v_new);
  }
  DeltaOutput result;
  result.out = out.view({b, heads, total, dv}).narrow(2, 0, s).transpose(1, 2).to(v_in.scalar_type()).contiguous();
  result.state = state;
  return result;
}

DeltaOutput recurrent_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                 const at::Tensor& g_in, const at::Tensor& beta_in, const at::Tensor& initial,
                                 bool reference) {
  const int64_t b = v_in.size(0), s = v_in.size(1), heads = v_in.size(2), dv = v_in.size(3), dk = k_in.size(3);
  if (!reference && kernel_ops::delta_rule_fits(v_in, k_in.size(2), heads, dk, dv)) {
    kernel_ops::DeltaRuleResult r = kernel_ops::recurrent_gated_delta_rule(q_in, k_in, v_in, g_in, beta_in, initial);
    return DeltaOutput{std::move(r.out), std::move(r.state)};
  }
  const auto f32 = v_in.options().dtype(at::kFloat);
  const at::Tensor q = l2norm(heads_first(q_in, heads)) / std::sqrt(static_cast<double>(dk));
  const at::Tensor k = l2norm(heads_first(k_in, heads));
  const at::Tensor v = v_in.transpose(1, 2).to(at::kFloat);
  const at::Tensor beta = beta_in.transpose(1, 2).to(at::kFloat);
  const at::Tensor g = g_in.transpose(1, 2).to(at::kFloat);
  at::Tensor state = initial.defined() ? initial.to(f32).clone() : at::zeros({b, heads, dk, dv}, f32);
  at::Tensor out = at::empty({b, heads, s, dv}, f32);
  DeltaOutput result;
  // The same operations as transformers' recurrent form, in the same order.
  for (int64_t t = 0; t < s; ++t) {
    const at::Tensor q_t = q.select(2, t), k_t = k.select(2, t), v_t = v.select(2, t);
    state = state * g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    const at::Tensor memory = (state * k_t.unsqueeze(-1)).sum(-2);
    const at::Tensor delta = (v_t - memory) * beta.select(2, t).unsqueeze(-1);
    state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
    out.select(2, t).copy_((state * q_t.unsqueeze(-1)).sum(-2));
  }
  result.out = out.transpose(1, 2).to(v_in.scalar_type()).contiguous();
  result.state = state;
  return result;
}

}  // namespace dflash::target::gdn
