#include "ttt_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::eagle3 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One chunk of query rows [r0, r1) with everything it reads, grouped by KV
// head: q as [B, kv, g·c, d] (a KV head's query heads one after another),
// keys and values of step 0 [B, kv, r1, d], own keys and values [B, kv, c, d].
struct Chunk {
  int64_t r0 = 0, r1 = 0, group = 1;
  at::Tensor q;                   // [B, kv, g·c, d]
  at::Tensor key0, value0;        // [B, kv, r1, d]
  std::vector<at::Tensor> ok, ov;  // [B, kv, c, d] each
  at::Tensor mask;                // [B, 1, 1, c, r1] bool: visible
};

at::Tensor rows_of(const at::Tensor& x, int64_t r0, int64_t r1) { return x.narrow(2, r0, r1 - r0); }

// q [B, heads, c, d] → [B, kv, g·c, d].
at::Tensor grouped(const at::Tensor& q, int64_t kv, int64_t group) {
  const int64_t b = q.size(0), c = q.size(2), d = q.size(3);
  return q.reshape({b, kv, group * c, d});
}

Chunk chunk_of(const at::Tensor& q, const at::Tensor& key0, const at::Tensor& value0, const variable_list& ok,
               const variable_list& ov, const at::Tensor& documents, int64_t r0, int64_t r1) {
  Chunk ch;
  ch.r0 = r0;
  ch.r1 = r1;
  const int64_t kv = key0.size(1);
  ch.group = q.size(1) / kv;
  ch.q = grouped(rows_of(q, r0, r1), kv, ch.group);
  ch.key0 = key0.narrow(2, 0, r1);
  ch.value0 = value0.narrow(2, 0, r1);
  for (size_t j = 0; j < ok.size(); ++j) {
    ch.ok.push_back(rows_of(ok[j], r0, r1));
    ch.ov.push_back(rows_of(ov[j], r0, r1));
  }
  const at::Tensor query_docs = documents.narrow(1, r0, r1 - r0), key_docs = documents.narrow(1, 0, r1);
  const at::Tensor query_index = at::arange(r0, r1, documents.options()), key_index = at::arange(r1, documents.options());
  ch.mask = query_docs.unsqueeze(2).eq(key_docs.unsqueeze(1))
                .logical_and(key_index.view({1, 1, r1}).le(query_index.view({1, -1, 1})))
                .view({documents.size(0), 1, 1, r1 - r0, r1});
  return ch;
}

// The dtype scores, softmax and gradients are formed in: fp32, or fp64 for
// fp64 inputs (the tests' reference precision).
at::ScalarType accumulation(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// The chunk's scores in the accumulation dtype: step 0's [B, kv, g, c, r1]
// (masked), and one [B, kv, g, c, 1] per own key.
struct Scores {
  at::Tensor main;
  std::vector<at::Tensor> own;
};
Scores scores_of(const Chunk& ch, double scale) {
  const int64_t b = ch.q.size(0), kv = ch.q.size(1), c = ch.r1 - ch.r0, d = ch.q.size(3);
  Scores s;
  const at::ScalarType acc = accumulation(ch.q);
  s.main = (at::matmul(ch.q, ch.key0.transpose(2, 3)) * scale)
               .to(acc)
               .view({b, kv, ch.group, c, ch.r1})
               .masked_fill(ch.mask.logical_not(), -std::numeric_limits<float>::infinity());
  const at::Tensor q5 = ch.q.view({b, kv, ch.group, c, d});
  for (const at::Tensor& k : ch.ok) s.own.push_back(((q5 * k.unsqueeze(2)).sum(-1, true) * scale).to(acc));
  return s;
}

class TttAttention : public torch::autograd::Function<TttAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& key0, const at::Tensor& value0,
                            at::TensorList own_keys, at::TensorList own_values, const at::Tensor& documents, double scale,
                            int64_t chunk_rows) {
    const int64_t b = q.size(0), heads = q.size(1), length = q.size(2), d = q.size(3), kv = key0.size(1);
    const variable_list ok(own_keys.begin(), own_keys.end()), ov(own_values.begin(), own_values.end());
    at::Tensor out = at::empty_like(q);
    at::Tensor lse = at::empty({b, kv, heads / kv, length}, q.options().dtype(accumulation(q)));
    for (int64_t r0 = 0; r0 < length; r0 += chunk_rows) {
      const int64_t r1 = std::min(length, r0 + chunk_rows), c = r1 - r0;
      const Chunk ch = chunk_of(q, key0, value0, ok, ov, documents, r0, r1);
      const Scores s = scores_of(ch, scale);
      std::vector<at::Tensor> all{s.main};
      all.insert(all.end(), s.own.begin(), s.own.end());
      const at::Tensor joint = at::cat(all, -1);  // [B, kv, g, c, r1 + k]
      const at::Tensor row_lse = at::logsumexp(joint, -1, true);
      const at::Tensor p = (joint - row_lse).exp().to(q.scalar_type());
      at::Tensor o = at::matmul(p.narrow(-1, 0, r1).reshape({b, kv, ch.group * c, r1}), ch.value0)
                         .view({b, kv, ch.group, c, d});
      for (size_t j = 0; j < ch.ov.size(); ++j)
        o = o + p.narrow(-1, r1 + static_cast<int64_t>(j), 1) * ch.ov[j].unsqueeze(2);
      out.narrow(2, r0, c).copy_(o.view({b, heads, c, d}));
      lse.narrow(3, r0, c).copy_(row_lse.squeeze(-1));
    }
    variable_list saved{q, key0, value0, documents, out, lse};
    saved.insert(saved.end(), ok.begin(), ok.end());
    saved.insert(saved.end(), ov.begin(), ov.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["own"] = static_cast<int64_t>(ok.size());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &key0 = saved[1], &value0 = saved[2], &documents = saved[3], &out = saved[4],
                     &lse = saved[5];
    const int64_t own = ctx->saved_data["own"].toInt();
    const variable_list ok(saved.begin() + 6, saved.begin() + 6 + own), ov(saved.begin() + 6 + own, saved.end());
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const int64_t b = q.size(0), heads = q.size(1), length = q.size(2), d = q.size(3), kv = key0.size(1),
                  group = heads / kv;
    const at::ScalarType acc = accumulation(q);
    const auto accumulate = q.options().dtype(acc);
    const at::Tensor grad_out = grads[0].to(acc);
    at::Tensor dq = at::zeros(q.sizes(), accumulate), dk0 = at::zeros(key0.sizes(), accumulate), dv0 = at::zeros(value0.sizes(), accumulate);
    std::vector<at::Tensor> dok, dov;
    for (int64_t j = 0; j < own; ++j) {
      dok.push_back(at::zeros(ok[j].sizes(), accumulate));
      dov.push_back(at::zeros(ov[j].sizes(), accumulate));
    }
    for (int64_t r0 = 0; r0 < length; r0 += chunk_rows) {
      const int64_t r1 = std::min(length, r0 + chunk_rows), c = r1 - r0;
      const Chunk ch = chunk_of(q, key0, value0, ok, ov, documents, r0, r1);
      const Scores s = scores_of(ch, scale);
      const at::Tensor row_lse = lse.narrow(3, r0, c).unsqueeze(-1);  // [B, kv, g, c, 1]
      const at::Tensor p = (s.main - row_lse).exp();                  // [B, kv, g, c, r1]
      const at::Tensor d_o = rows_of(grad_out, r0, r1).reshape({b, kv, group, c, d}).contiguous();
      // D = Σ_keys p · (dO · v): the softmax's backward, over the joint key set.
      const at::Tensor dp = at::matmul(d_o.view({b, kv, group * c, d}), ch.value0.to(acc).transpose(2, 3))
                                .view({b, kv, group, c, r1});
      at::Tensor delta = (p * dp).sum(-1, true);
      std::vector<at::Tensor> p_own, dp_own;
      for (int64_t j = 0; j < own; ++j) {
        p_own.push_back((s.own[static_cast<size_t>(j)] - row_lse).exp());
        dp_own.push_back((d_o * ch.ov[static_cast<size_t>(j)].to(acc).unsqueeze(2)).sum(-1, true));
        delta = delta + p_own.back() * dp_own.back();
      }
      const at::Tensor ds = p * (dp - delta) * scale;  // [B, kv, g, c, r1]
      const at::Tensor q32 = ch.q.to(acc);             // [B, kv, g·c, d]
      const at::Tensor ds_rows = ds.view({b, kv, group * c, r1});
      at::Tensor dq_chunk = at::matmul(ds_rows, ch.key0.to(acc)).view({b, kv, group, c, d});
      dk0.narrow(2, 0, r1).add_(at::matmul(ds_rows.transpose(2, 3), q32));
      dv0.narrow(2, 0, r1).add_(at::matmul(p.view({b, kv, group * c, r1}).transpose(2, 3), d_o.view({b, kv, group * c, d})));
      const at::Tensor q5 = q32.view({b, kv, group, c, d});
      for (int64_t j = 0; j < own; ++j) {
        const at::Tensor ds_j = p_own[static_cast<size_t>(j)] * (dp_own[static_cast<size_t>(j)] - delta) * scale;  // [B, kv, g, c, 1]
        dq_chunk = dq_chunk + ds_j * ch.ok[static_cast<size_t>(j)].to(acc).unsqueeze(2);
        dok[static_cast<size_t>(j)].narrow(2, r0, c).add_((ds_j * q5).sum(2));
        dov[static_cast<size_t>(j)].narrow(2, r0, c).add_((p_own[static_cast<size_t>(j)] * d_o).sum(2));
      }
      dq.narrow(2, r0, c).copy_(dq_chunk.view({b, heads, c, d}));
    }
    (void)out;
    variable_list result{dq.to(q.scalar_type()), dk0.to(key0.scalar_type()), dv0.to(value0.scalar_type())};
    for (int64_t j = 0; j < own; ++j) result.push_back(dok[static_cast<size_t>(j)].to(ok[static_cast<size_t>(j)].scalar_type()));
    for (int64_t j = 0; j < own; ++j) result.push_back(dov[static_cast<size_t>(j)].to(ov[static_cast<size_t>(j)].scalar_type()));
    result.push_back(at::Tensor());  // documents
    result.push_back(at::Tensor());  // scale
    result.push_back(at::Tensor());  // chunk_rows
    return result;
  }
};

}  // namespace

int64_t ttt_attention_chunk_rows(int64_t batch, int64_t heads, int64_t length, int64_t score_bytes) {
  // A chunk's largest temporaries are a few fp32 [B, heads, c, S] tensors.
  const int64_t per_row = std::max<int64_t>(1, batch * heads * length * 4);
  return std::clamp<int64_t>(score_bytes / per_row, 1, std::max<int64_t>(1, length));
}

at::Tensor ttt_attention(const at::Tensor& q, const at::Tensor& key0, const at::Tensor& value0, at::TensorList own_keys,
                         at::TensorList own_values, const at::Tensor& documents, double scale, int64_t score_bytes) {
  if (q.dim() != 4 || key0.dim() != 4 || value0.sizes() != key0.sizes() || key0.size(0) != q.size(0) ||
      key0.size(2) != q.size(2) || key0.size(3) != q.size(3) || q.size(1) % key0.size(1) != 0)
    throw std::invalid_argument("ttt_attention: q must be [B, heads, S, d] and key0, value0 [B, kv_heads, S, d] with "
                                "kv_heads dividing heads; got q " + c10::str(q.sizes()) + ", key0 " +
                                c10::str(key0.sizes()) + ", value0 " + c10::str(value0.sizes()));
  if (own_keys.size() != own_values.size())
    throw std::invalid_argument("ttt_attention: " + std::to_string(own_keys.size()) + " own keys but " +
                                std::to_string(own_values.size()) + " own values");
  for (size_t j = 0; j < own_keys.size(); ++j)
    if (own_keys[j].sizes() != key0.sizes() || own_values[j].sizes() != key0.sizes())
      throw std::invalid_argument("ttt_attention: own keys and values must be key0's shape " + c10::str(key0.sizes()));
  if (documents.dim() != 2 || documents.size(0) != q.size(0) || documents.size(1) != q.size(2))
    throw std::invalid_argument("ttt_attention: documents must be [B, S]");
  const int64_t chunk = ttt_attention_chunk_rows(q.size(0), q.size(1), q.size(2), score_bytes);
  return TttAttention::apply(q, key0, value0, own_keys, own_values, documents.to(q.device(), at::kLong), scale, chunk);
}

}  // namespace dflash::eagle3
