#include "ttt_flash_attention.h"

#include <dflash/sdk/torch_compat.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#if DFLASH_TORCH_AT_LEAST(2, 5)
#include <ATen/ops/_flash_attention_backward.h>
#include <ATen/ops/_flash_attention_forward.h>
#endif

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::eagle3 {

TttSequences ttt_sequences(const at::Tensor& documents, const c10::Device& device) {
  const at::Tensor docs = documents.to(at::kCPU, at::kLong).contiguous();
  if (docs.dim() != 2) throw std::invalid_argument("ttt_sequences: documents must be [B, S]");
  const int64_t rows = docs.size(0), length = docs.size(1);
  const int64_t* d = docs.data_ptr<int64_t>();
  std::vector<int32_t> cu{0};
  std::vector<int64_t> sequence(static_cast<size_t>(rows * length)), offset(static_cast<size_t>(rows * length));
  int64_t max_length = 0, start = 0;
  for (int64_t t = 0; t < rows * length; ++t) {
    const bool starts = t % length == 0 || d[t] != d[t - 1];
    if (starts && t > 0) {
      cu.push_back(static_cast<int32_t>(t));
      max_length = std::max(max_length, t - start);
    }
    if (starts) start = t;
    sequence[static_cast<size_t>(t)] = static_cast<int64_t>(cu.size()) - 1;
    offset[static_cast<size_t>(t)] = t - start;
  }
  cu.push_back(static_cast<int32_t>(rows * length));
  max_length = std::max(max_length, rows * length - start);
  TttSequences s;
  s.cu_seqlens = at::tensor(cu, at::kInt).to(device);
  s.token_sequence = at::tensor(sequence, at::kLong).to(device);
  s.token_offset = at::tensor(offset, at::kLong).to(device);
  s.max_length = max_length;
  return s;
}

#if DFLASH_TORCH_AT_LEAST(2, 5)

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [B, h, S, d] → [B·S, h, d], the varlen layout (rows one after another).
at::Tensor tokens_first(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0) * x.size(2), x.size(1), x.size(3)}).contiguous();
}
// [B·S, h, d] → [B, h, S, d].
at::Tensor heads_first(const at::Tensor& x, int64_t rows) {
  return x.reshape({rows, x.size(0) / rows, x.size(1), x.size(2)}).transpose(1, 2);
}

// Flash attention's log-sum-exp as [tokens, heads] fp32, and back. Its
// layout is [heads, tokens] in newer flash attention, [sequences, heads,
// max_length (padded)] in older; both are read.
at::Tensor lse_by_token(const at::Tensor& lse, const TttSequences& s, int64_t tokens, int64_t heads) {
  if (lse.dim() == 2 && lse.size(0) == heads && lse.size(1) >= tokens) return lse.narrow(1, 0, tokens).t();
  if (lse.dim() == 3 && lse.size(1) == heads)
    return lse.index({s.token_sequence, at::indexing::Slice(), s.token_offset});  // [tokens, heads]
  throw std::runtime_error("ttt_flash_attention: flash attention's log-sum-exp has an unknown layout " +
                           c10::str(lse.sizes()));
}
at::Tensor lse_in_flash_layout(const at::Tensor& by_token, const at::Tensor& like, const TttSequences& s) {
  if (like.dim() == 2) {
    at::Tensor out = like.clone();
    out.narrow(1, 0, by_token.size(0)).copy_(by_token.t());
    return out;
  }
  at::Tensor out = like.clone();
  out.index_put_({s.token_sequence, at::indexing::Slice(), s.token_offset}, by_token);
  return out;
}

// Key heads repeated for their query heads: [T, kv, d] → [T, heads, d].
at::Tensor per_query_head(const at::Tensor& x, int64_t group) { return group == 1 ? x : x.repeat_interleave(group, 1); }
// Summed back over each key head's query heads: [T, heads, ...] → [T, kv, ...].
at::Tensor per_key_head(const at::Tensor& x, int64_t group) {
  if (group == 1) return x;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[1] /= group;
  shape.insert(shape.begin() + 2, group);
  return x.view(shape).sum(2);
}

class FlashTttAttention : public torch::autograd::Function<FlashTttAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& key0, const at::Tensor& value0,
                            at::TensorList own_keys, at::TensorList own_values, const at::Tensor& cu_seqlens,
                            const at::Tensor& token_sequence, const at::Tensor& token_offset, int64_t max_length, double scale) {
    const int64_t rows = q.size(0), heads = q.size(1), kv = key0.size(1), group = heads / kv;
    const at::Tensor qf = tokens_first(q), kf = tokens_first(key0), vf = tokens_first(value0);
    const int64_t tokens = qf.size(0);
    TttSequences s{cu_seqlens, token_sequence, token_offset, max_length};
    auto flash = at::_flash_attention_forward(qf, kf, vf, cu_seqlens, cu_seqlens, max_length, max_length, /*dropout_p=*/0.0,
                                              /*is_causal=*/true, /*return_debug_mask=*/false, scale);
    const at::Tensor& out0 = std::get<0>(flash);
    const at::Tensor& flash_lse = std::get<1>(flash);
    // The merge by log-sum-exp, in fp32: m = max(lse₀, sⱼ), Z = e^(lse₀−m) + Σ e^(sⱼ−m).
    const at::Tensor lse0 = lse_by_token(flash_lse, s, tokens, heads).to(at::kFloat);  // [T, heads]
    variable_list own_k, own_v, scores;
    const at::Tensor q32 = own_keys.empty() ? at::Tensor() : qf.to(at::kFloat);  // once for every own key
    for (size_t j = 0; j < own_keys.size(); ++j) {
      own_k.push_back(tokens_first(own_keys[j]));
      own_v.push_back(tokens_first(own_values[j]));
      scores.push_back((q32 * per_query_head(own_k.back(), group).to(at::kFloat)).sum(-1) * scale);
    }
    at::Tensor m = lse0;
    for (const at::Tensor& sj : scores) m = at::maximum(m, sj);
    const at::Tensor w0 = (lse0 - m).exp();
    at::Tensor z = w0, numerator = w0.unsqueeze(-1) * out0.to(at::kFloat);
    for (size_t j = 0; j < scores.size(); ++j) {
      const at::Tensor wj = (scores[j] - m).exp();
      z = z + wj;
      numerator = numerator + wj.unsqueeze(-1) * per_query_head(own_v[j], group).to(at::kFloat);
    }
    const at::Tensor out = (numerator / z.unsqueeze(-1)).to(q.scalar_type());  // [T, heads, d]
    const at::Tensor lse = m + z.log();                                          // [T, heads]
    variable_list saved{qf, kf, vf, out, lse, lse_in_flash_layout(lse, flash_lse, s), std::get<2>(flash), std::get<3>(flash),
                        cu_seqlens};
    saved.insert(saved.end(), own_k.begin(), own_k.end());
    saved.insert(saved.end(), own_v.begin(), own_v.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["own"] = static_cast<int64_t>(own_k.size());
    ctx->saved_data["max_length"] = max_length;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["rows"] = rows;
    return heads_first(out, rows);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &qf = saved[0], &kf = saved[1], &vf = saved[2], &out = saved[3], &lse = saved[4], &flash_lse = saved[5],
                     &rng_state = saved[6], &unused = saved[7], &cu_seqlens = saved[8];
    const int64_t own = ctx->saved_data["own"].toInt(), max_length = ctx->saved_data["max_length"].toInt(),
                  rows = ctx->saved_data["rows"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const variable_list own_k(saved.begin() + 9, saved.begin() + 9 + own), own_v(saved.begin() + 9 + own, saved.end());
    const int64_t heads = qf.size(1), group = heads / kf.size(1);
    const at::Tensor d_out = tokens_first(grads[0]).to(qf.scalar_type());
    // Step 0's part: flash's backward with the merged output and log-sum-exp.
    auto flash = at::_flash_attention_backward(d_out, qf, kf, vf, out, flash_lse, cu_seqlens, cu_seqlens, max_length,
                                               max_length, /*dropout_p=*/0.0, /*is_causal=*/true, rng_state, unused, scale);
    variable_list result{heads_first(std::get<0>(flash), rows), heads_first(std::get<1>(flash), rows),
                         heads_first(std::get<2>(flash), rows)};
    if (own > 0) {
      // The own keys: pⱼ = e^(sⱼ − lse), dsⱼ = pⱼ (dO·vⱼ − D) · scale, D = rowsum(dO ⊙ O).
      const at::Tensor d32 = d_out.to(at::kFloat), q32 = qf.to(at::kFloat);
      const at::Tensor delta = (d32 * out.to(at::kFloat)).sum(-1);  // [T, heads]
      at::Tensor dq = std::get<0>(flash).to(at::kFloat);
      variable_list dk, dv;
      for (int64_t j = 0; j < own; ++j) {
        const at::Tensor k32 = per_query_head(own_k[static_cast<size_t>(j)], group).to(at::kFloat);
        const at::Tensor v32 = per_query_head(own_v[static_cast<size_t>(j)], group).to(at::kFloat);
        const at::Tensor p = ((q32 * k32).sum(-1) * scale - lse).exp();                // [T, heads]
        const at::Tensor ds = (p * ((d32 * v32).sum(-1) - delta) * scale).unsqueeze(-1);  // [T, heads, 1]
        dq = dq + ds * k32;
        dk.push_back(heads_first(per_key_head(ds * q32, group).to(kf.scalar_type()), rows));
        dv.push_back(heads_first(per_key_head(p.unsqueeze(-1) * d32, group).to(vf.scalar_type()), rows));
      }
      result[0] = heads_first(dq.to(qf.scalar_type()), rows);
      result.insert(result.end(), dk.begin(), dk.end());
      result.insert(result.end(), dv.begin(), dv.end());
    }
    // cu_seqlens, token_sequence, token_offset, max_length, scale
    for (int i = 0; i < 5; ++i) result.push_back(at::Tensor());
    return result;
  }
};

}  // namespace

bool ttt_flash_attention_available(const at::Tensor& like, int64_t head_dim) {
  return like.is_cuda() && (like.scalar_type() == at::kBFloat16 || like.scalar_type() == at::kHalf) && head_dim % 8 == 0 &&
         head_dim <= 256;
}

at::Tensor ttt_flash_attention(const at::Tensor& q, const at::Tensor& key0, const at::Tensor& value0, at::TensorList own_keys,
                               at::TensorList own_values, const TttSequences& sequences, double scale) {
  if (!ttt_flash_attention_available(q, q.size(-1)))
    throw std::invalid_argument("ttt_flash_attention: needs CUDA bf16/fp16 with head_dim a multiple of 8 up to 256");
  return FlashTttAttention::apply(q, key0, value0, own_keys, own_values, sequences.cu_seqlens, sequences.token_sequence,
                                  sequences.token_offset, sequences.max_length, scale);
}

#else  // LibTorch before 2.5: no varlen flash attention to call

bool ttt_flash_attention_available(const at::Tensor&, int64_t) { return false; }

at::Tensor ttt_flash_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::TensorList, at::TensorList,
                               const TttSequences&, double) {
  throw std::logic_error("ttt_flash_attention: needs LibTorch >= 2.5");
}

#endif

}  // namespace dflash::eagle3
