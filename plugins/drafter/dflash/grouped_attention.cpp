#include "grouped_attention.h"

#include "block_layout.h"
#include "row_gather.h"

#include <dflash/sdk/torch_compat.hpp>
#include <kernel_ops.h>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#if DFLASH_TORCH_AT_LEAST(2, 5)
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward.h>
#define DFLASH_DRAFTER_CUDNN_ATTENTION 1
#else
#define DFLASH_DRAFTER_CUDNN_ATTENTION 0
#endif

namespace dflash::drafter {
namespace {

double scale_of(const at::Tensor& q) { return 1.0 / std::sqrt(static_cast<double>(q.size(-1))); }

c10::optional<at::Tensor> optional_bias(const at::Tensor& bias) {
  return bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
}

#if DFLASH_DRAFTER_CUDNN_ATTENTION
// The kernels' sequence lengths, whether LibTorch returns them as SymInt or int64.
[[maybe_unused]] int64_t as_int(int64_t v) { return v; }
[[maybe_unused]] int64_t as_int(const c10::SymInt& v) { return v.expect_int(); }
#endif

// [count·length, heads, d] rows of a call → [count, heads, length, d], and back.
at::Tensor by_call(const at::Tensor& rows, int64_t count, int64_t length) {
  return rows.view({count, length, rows.size(1), rows.size(2)}).transpose(1, 2);
}
at::Tensor as_rows(const at::Tensor& t) {
  return t.transpose(1, 2).reshape({t.size(0) * t.size(2), t.size(1), t.size(3)});
}

// Ranges through saved_data: per call its query and key range counts, then
// their starts and lengths.
void flatten_ranges(std::vector<int64_t>& flat, const AttentionCall& c) {
  flat.push_back(static_cast<int64_t>(c.query_ranges.size()));
  flat.push_back(static_cast<int64_t>(c.key_ranges.size()));
  for (const auto* ranges : {&c.query_ranges, &c.key_ranges})
    for (const RowRange& r : *ranges) flat.insert(flat.end(), {r.start, r.length});
}
std::pair<std::vector<RowRange>, std::vector<RowRange>> unflatten_ranges(const std::vector<int64_t>& flat, size_t& at) {
  const auto queries = static_cast<size_t>(flat[at]), keys = static_cast<size_t>(flat[at + 1]);
  at += 2;
  std::pair<std::vector<RowRange>, std::vector<RowRange>> out;
  for (size_t i = 0; i < queries + keys; ++i, at += 2) (i < queries ? out.first : out.second).push_back({flat[at], flat[at + 1]});
  return out;
}

// Per call, what backward needs beside the rows: the output, its
// log-sum-exp and cuDNN's other returns (undefined off cuDNN).
constexpr size_t kSavedPerCall = 6;  // out, lse, cum_seq_q, cum_seq_k, philox_seed, philox_offset
constexpr size_t kRows = 3;          // q, k, v rows first

class AttentionKeepingRows : public torch::autograd::Function<AttentionKeepingRows> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q_rows,
                                                const at::Tensor& k_rows, const at::Tensor& v_rows,
                                                const std::vector<AttentionCall>& calls, int64_t heads, int64_t kv_heads,
                                                bool cudnn) {
    (void)cudnn;  // without cuDNN attention in this LibTorch, every call is attend's
    torch::autograd::variable_list outs;
    std::vector<at::Tensor> saved = {q_rows, k_rows, v_rows};
    std::vector<int64_t> max_q, max_k, ranges;
    std::vector<at::Tensor> query_index, key_index, biases;
    for (const AttentionCall& c : calls) {
      const at::Tensor q = by_call(take_rows(q_rows, c.query_index, c.query_ranges), c.count, c.queries);
      const at::Tensor k = by_call(take_rows(k_rows, c.key_index, c.key_ranges), c.count, c.keys);
      const at::Tensor v = by_call(take_rows(v_rows, c.key_index, c.key_ranges), c.count, c.keys);
      flatten_ranges(ranges, c);
      at::Tensor out, lse, cum_q, cum_k, seed, offset;
      int64_t mq = 0, mk = 0;
#if DFLASH_DRAFTER_CUDNN_ATTENTION
      if (cudnn) {
        auto r = at::_scaled_dot_product_cudnn_attention(q, k, v, optional_bias(c.bias), /*compute_log_sumexp=*/true,
                                                         /*dropout_p=*/0.0, /*is_causal=*/false,
                                                         /*return_debug_mask=*/false, scale_of(q));
        out = std::get<0>(r), lse = std::get<1>(r), cum_q = std::get<2>(r), cum_k = std::get<3>(r);
        mq = as_int(std::get<4>(r)), mk = as_int(std::get<5>(r));
        seed = std::get<6>(r), offset = std::get<7>(r);
      }
#endif
      if (!out.defined()) out = attend(q, k, v, c.bias, heads, kv_heads, /*cudnn=*/false);
      outs.push_back(out);
      saved.insert(saved.end(), {out, lse, cum_q, cum_k, seed, offset});
      max_q.push_back(mq), max_k.push_back(mk);
      query_index.push_back(c.query_index), key_index.push_back(c.key_index), biases.push_back(c.bias);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["query_index"] = query_index;
    ctx->saved_data["key_index"] = key_index;
    ctx->saved_data["bias"] = biases;
    ctx->saved_data["max_q"] = max_q;
    ctx->saved_data["max_k"] = max_k;
    ctx->saved_data["ranges"] = ranges;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["cudnn"] = cudnn;
    return outs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q_rows = saved[0], &k_rows = saved[1], &v_rows = saved[2];
    const std::vector<at::Tensor> query_index = ctx->saved_data["query_index"].toTensorVector();
    const std::vector<at::Tensor> key_index = ctx->saved_data["key_index"].toTensorVector();
    const std::vector<at::Tensor> biases = ctx->saved_data["bias"].toTensorVector();
    const std::vector<int64_t> max_q = ctx->saved_data["max_q"].toIntVector(), max_k = ctx->saved_data["max_k"].toIntVector();
    const int64_t heads = ctx->saved_data["heads"].toInt(), kv_heads = ctx->saved_data["kv_heads"].toInt();
    [[maybe_unused]] const bool cudnn = ctx->saved_data["cudnn"].toBool();
    const std::vector<int64_t> ranges = ctx->saved_data["ranges"].toIntVector();
    at::Tensor dq_rows = at::zeros_like(q_rows), dk_rows = at::zeros_like(k_rows), dv_rows = at::zeros_like(v_rows);
    size_t ranges_at = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      const auto [query_ranges, key_ranges] = unflatten_ranges(ranges, ranges_at);
      if (!grads[i].defined()) continue;
      const at::Tensor* call = &saved[kRows + kSavedPerCall * i];  // out, lse, cum_q, cum_k, seed, offset
      const at::Tensor& out = call[0];
      const int64_t count = out.size(0), queries = out.size(2), keys = key_index[i].numel() / count;
      // The call's q, k and v, gathered again from the rows.
      at::Tensor q = by_call(take_rows(q_rows, query_index[i], query_ranges), count, queries);
      at::Tensor k = by_call(take_rows(k_rows, key_index[i], key_ranges), count, keys);
      at::Tensor v = by_call(take_rows(v_rows, key_index[i], key_ranges), count, keys);
      at::Tensor dq, dk, dv;
#if DFLASH_DRAFTER_CUDNN_ATTENTION
      if (cudnn) {
        auto r = at::_scaled_dot_product_cudnn_attention_backward(grads[i], q, k, v, out, call[1], call[4], call[5],
                                                                  biases[i], call[2], call[3], max_q[i], max_k[i],
                                                                  /*dropout_p=*/0.0, /*is_causal=*/false, scale_of(q));
        dq = std::get<0>(r), dk = std::get<1>(r), dv = std::get<2>(r);
      }
#endif
      if (!dq.defined()) {  // the call again, under autograd
        const c10::AutoGradMode enable(true);
        q = q.detach().requires_grad_(true), k = k.detach().requires_grad_(true), v = v.detach().requires_grad_(true);
        const auto g = torch::autograd::grad({attend(q, k, v, biases[i], heads, kv_heads, /*cudnn=*/false)}, {q, k, v},
                                             {grads[i]});
        dq = g[0], dk = g[1], dv = g[2];
      }
      put_rows(dq_rows, query_index[i], query_ranges, as_rows(dq), /*add=*/false);
      put_rows(dk_rows, key_index[i], key_ranges, as_rows(dk), /*add=*/true);
      put_rows(dv_rows, key_index[i], key_ranges, as_rows(dv), /*add=*/true);
    }
    return {dq_rows, dk_rows, dv_rows, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The prefix calls' cuDNN attention and the block kernel: see
// prefix_block_attention. prefixes' columns are block_layout.h's PrefixColumn.
constexpr size_t kSavedPerPrefix = 4;  // cum_seq_q, cum_seq_k, philox_seed, philox_offset

// ---- The ATen reference of both parts (any device, any floating dtype; the
// CPU's path, the GPU's check): one part is `queries` rows from query_row
// against the k/v rows `keys` (int64 on q's device), every query head of a
// KV head sharing them.
struct PartForward {
  at::Tensor out, lse;  // [queries, heads, d]; fp32/fp64 [queries, heads]
};
at::Tensor part_keys(const at::Tensor& k_rows, const at::Tensor& keys, int64_t heads) {  // [n, heads, d]
  return k_rows.index_select(0, keys).repeat_interleave(heads / k_rows.size(1), 1);
}
at::Tensor part_scores(const at::Tensor& q, const at::Tensor& k, double scale) {  // [heads, queries, n], fp32 or wider
  const auto wide = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::matmul(q.to(wide).transpose(0, 1), k.to(wide).permute({1, 2, 0})) * scale;
}
PartForward reference_part(const at::Tensor& q_rows, const at::Tensor& k_rows, const at::Tensor& v_rows, int64_t query_row,
                           int64_t queries, const at::Tensor& keys, double scale) {
  const int64_t heads = q_rows.size(1);
  const at::Tensor scores = part_scores(q_rows.narrow(0, query_row, queries), part_keys(k_rows, keys, heads), scale);
  const at::Tensor lse = at::logsumexp(scores, -1);  // [heads, queries]
  const at::Tensor p = at::exp(scores - lse.unsqueeze(-1));
  const at::Tensor v = part_keys(v_rows, keys, heads).to(p.scalar_type());
  return {at::matmul(p, v.transpose(0, 1)).transpose(0, 1).to(q_rows.scalar_type()), lse.t().contiguous()};
}
// The gradients through one part's keys, given the whole row's (merged)
// output and log-sum-exp: added into dq_rows, dk_rows, dv_rows.
void reference_part_backward(const at::Tensor& q_rows, const at::Tensor& k_rows, const at::Tensor& v_rows,
                             const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out, int64_t query_row,
                             int64_t queries, const at::Tensor& keys, double scale, at::Tensor& dq_rows, at::Tensor& dk_rows,
                             at::Tensor& dv_rows) {
  const int64_t heads = q_rows.size(1), group = heads / k_rows.size(1);
  const at::Tensor q = q_rows.narrow(0, query_row, queries), k = part_keys(k_rows, keys, heads);
  const at::Tensor scores = part_scores(q, k, scale);
  const auto wide = scores.scalar_type();
  const at::Tensor p = at::exp(scores - lse.narrow(0, query_row, queries).t().to(wide).unsqueeze(-1));  // [h, q, n]
  const at::Tensor d_out = grad_out.narrow(0, query_row, queries).to(wide).transpose(0, 1);               // [h, q, d]
  const at::Tensor o = out.narrow(0, query_row, queries).to(wide).transpose(0, 1);
  const at::Tensor v = part_keys(v_rows, keys, heads).to(wide).transpose(0, 1);                           // [h, n, d]
  const at::Tensor delta = (d_out * o).sum(-1, true);
  const at::Tensor ds = p * (at::matmul(d_out, v.transpose(1, 2)) - delta);
  dq_rows.narrow(0, query_row, queries).add_((at::matmul(ds, k.to(wide).transpose(0, 1)) * scale).transpose(0, 1).to(dq_rows.scalar_type()));
  // Per KV head: its query heads' sums.
  auto per_kv = [&](const at::Tensor& t) {  // [h, n, d] → [n, kv, d]
    return t.view({k_rows.size(1), group, t.size(1), t.size(2)}).sum(1).transpose(0, 1);
  };
  dk_rows.index_add_(0, keys, per_kv(at::matmul(ds.transpose(1, 2), q.to(wide).transpose(0, 1)) * scale).to(dk_rows.scalar_type()));
  dv_rows.index_add_(0, keys, per_kv(at::matmul(p.transpose(1, 2), d_out)).to(dv_rows.scalar_type()));
}
// An entry's keys (block_attention.h's BlockKeys row): its context range, then its slots.
at::Tensor entry_keys(at::TensorAccessor<int64_t, 1> b, const at::TensorOptions& longs) {
  const int64_t key_row = b[1], begin = b[2], end = b[3], slot_row = b[4], slots = b[5];
  return at::cat({at::arange(key_row + begin, key_row + end, longs), at::arange(slot_row, slot_row + slots, longs)});
}
at::Tensor prefix_keys(at::TensorAccessor<int64_t, 1> p, const at::TensorOptions& longs) {
  return at::arange(p[kPrefixKeyRow], p[kPrefixKeyRow] + p[kPrefixKeys], longs);
}
// The kernel's work by the reference, entry by entry (blocks as a CPU table).
kernel_ops::BlockAttentionForward reference_blocks_forward(const at::Tensor& q_rows, const at::Tensor& k_rows,
                                                           const at::Tensor& v_rows, const at::Tensor& blocks,
                                                           const at::Tensor& prior_out, const at::Tensor& prior_lse,
                                                           double scale) {
  constexpr int64_t kRowsPerEntry = cuda_kernels::kEntryRows;
  const auto wide = q_rows.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  kernel_ops::BlockAttentionForward f{at::empty_like(q_rows), at::empty({q_rows.size(0), q_rows.size(1)}, q_rows.options().dtype(wide))};
  const at::Tensor host_blocks = blocks.to(at::kCPU);
  const auto b = host_blocks.accessor<int64_t, 2>();
  const auto longs = q_rows.options().dtype(at::kLong);
  for (int64_t e = 0; e < b.size(0); ++e) {
    const int64_t row = b[e][0];
    PartForward part = reference_part(q_rows, k_rows, v_rows, row, kRowsPerEntry, entry_keys(b[e], longs), scale);
    if (prior_lse.defined()) {  // merged by log-sum-exp; −inf priors weigh nothing
      const at::Tensor prior = prior_lse.narrow(0, row, kRowsPerEntry).to(wide);
      const at::Tensor merged = at::logaddexp(part.lse, prior);
      part.out = (part.out.to(wide) * at::exp(part.lse - merged).unsqueeze(-1) +
                  prior_out.narrow(0, row, kRowsPerEntry).to(wide) * at::exp(prior - merged).unsqueeze(-1))
                     .to(q_rows.scalar_type());
      part.lse = merged;
    }
    f.out.narrow(0, row, kRowsPerEntry).copy_(part.out);
    f.lse.narrow(0, row, kRowsPerEntry).copy_(part.lse);
  }
  return f;
}

// Whether this step's parts run on the GPU's kernels (the CUDA block kernel
// and cuDNN's attention) or by the ATen reference.
bool on_kernels(const at::Tensor& q_rows, const at::Tensor& k_rows) {
  return DFLASH_DRAFTER_CUDNN_ATTENTION &&
         kernel_ops::block_attention_fits(q_rows, q_rows.size(1), k_rows.size(1), q_rows.size(2), cuda_kernels::kEntryRows);
}

class PrefixBlockAttention : public torch::autograd::Function<PrefixBlockAttention> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q_rows,
                                                const at::Tensor& k_rows, const at::Tensor& v_rows,
                                                const at::Tensor& prefixes, const at::Tensor& blocks,
                                                const at::Tensor& tiles) {
    const double scale = scale_of(q_rows);
    const int64_t heads = q_rows.size(1);
    const bool kernels = on_kernels(q_rows, k_rows);
    at::Tensor prior_out, prior_lse;
    std::vector<at::Tensor> saved;
    std::vector<int64_t> max_q, max_k, lse_sizes;
    const auto p = prefixes.accessor<int64_t, 2>();
    if (p.size(0) > 0) {
      prior_out = at::zeros_like(q_rows);
      prior_lse = at::full({q_rows.size(0), heads}, -std::numeric_limits<double>::infinity(),
                           q_rows.options().dtype(q_rows.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
    }
    for (int64_t i = 0; i < p.size(0); ++i) {
      const int64_t queries = p[i][kPrefixQueries], keys = p[i][kPrefixKeys];
      if (!kernels) {
        const PartForward part = reference_part(q_rows, k_rows, v_rows, p[i][kPrefixQueryRow], queries,
                                                prefix_keys(p[i], q_rows.options().dtype(at::kLong)), scale);
        prior_out.narrow(0, p[i][kPrefixQueryRow], queries).copy_(part.out);
        prior_lse.narrow(0, p[i][kPrefixQueryRow], queries).copy_(part.lse);
        continue;
      }
#if DFLASH_DRAFTER_CUDNN_ATTENTION
      const at::Tensor q = by_call(q_rows.narrow(0, p[i][kPrefixQueryRow], queries), 1, queries);
      const at::Tensor k = by_call(k_rows.narrow(0, p[i][kPrefixKeyRow], keys), 1, keys);
      const at::Tensor v = by_call(v_rows.narrow(0, p[i][kPrefixKeyRow], keys), 1, keys);
      auto r = at::_scaled_dot_product_cudnn_attention(q, k, v, c10::nullopt, /*compute_log_sumexp=*/true,
                                                       /*dropout_p=*/0.0, /*is_causal=*/false,
                                                       /*return_debug_mask=*/false, scale);
      const at::Tensor& call_lse = std::get<1>(r);
      prior_out.narrow(0, p[i][kPrefixQueryRow], queries).copy_(as_rows(std::get<0>(r)));
      prior_lse.narrow(0, p[i][kPrefixQueryRow], queries).copy_(call_lse.reshape({heads, queries}).t());
      saved.insert(saved.end(), {std::get<2>(r), std::get<3>(r), std::get<6>(r), std::get<7>(r)});
      max_q.push_back(as_int(std::get<4>(r))), max_k.push_back(as_int(std::get<5>(r)));
      if (lse_sizes.empty()) lse_sizes = call_lse.sizes().vec();
#else
      throw std::logic_error("prefix_block_attention: this LibTorch has no cuDNN attention");
#endif
    }
    const kernel_ops::BlockAttentionForward f =
        kernels ? kernel_ops::block_attention_forward(q_rows, k_rows, v_rows, blocks, prior_out, prior_lse, scale)
                : reference_blocks_forward(q_rows, k_rows, v_rows, blocks, prior_out, prior_lse, scale);
    std::vector<at::Tensor> kept = {q_rows, k_rows, v_rows, f.out, f.lse, prefixes, blocks, tiles};
    kept.insert(kept.end(), saved.begin(), saved.end());
    ctx->save_for_backward(kept);
    ctx->saved_data["max_q"] = max_q;
    ctx->saved_data["max_k"] = max_k;
    ctx->saved_data["lse_sizes"] = lse_sizes;
    return {f.out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q_rows = saved[0], &k_rows = saved[1], &v_rows = saved[2], &out = saved[3], &lse = saved[4];
    const at::Tensor &prefixes = saved[5], &blocks = saved[6], &tiles = saved[7];
    const at::Tensor grad_out = grads[0].contiguous();
    const double scale = scale_of(q_rows);
    const auto p = prefixes.accessor<int64_t, 2>();
    if (!on_kernels(q_rows, k_rows)) {  // the reference: every part's gradients given the merged out and lse
      kernel_ops::BlockAttentionGrads g{at::zeros_like(q_rows), at::zeros_like(k_rows), at::zeros_like(v_rows)};
      const auto longs = q_rows.options().dtype(at::kLong);
      const at::Tensor host_blocks = blocks.to(at::kCPU);
      const auto b = host_blocks.accessor<int64_t, 2>();
      for (int64_t e = 0; e < b.size(0); ++e)
        reference_part_backward(q_rows, k_rows, v_rows, out, lse, grad_out, b[e][0], cuda_kernels::kEntryRows,
                                entry_keys(b[e], longs), scale,
                                g.dq, g.dk, g.dv);
      for (int64_t i = 0; i < p.size(0); ++i)
        reference_part_backward(q_rows, k_rows, v_rows, out, lse, grad_out, p[i][kPrefixQueryRow], p[i][kPrefixQueries],
                                prefix_keys(p[i], longs), scale, g.dq, g.dk, g.dv);
      return {g.dq, g.dk, g.dv, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    kernel_ops::BlockAttentionGrads g =
        kernel_ops::block_attention_backward(q_rows, k_rows, v_rows, out, lse, grad_out, blocks, tiles, scale);
#if DFLASH_DRAFTER_CUDNN_ATTENTION
    const std::vector<int64_t> max_q = ctx->saved_data["max_q"].toIntVector(), max_k = ctx->saved_data["max_k"].toIntVector();
    const std::vector<int64_t> lse_sizes = ctx->saved_data["lse_sizes"].toIntVector();
    for (int64_t i = 0; i < p.size(0); ++i) {
      const at::Tensor* call = &saved[8 + kSavedPerPrefix * static_cast<size_t>(i)];  // cum_q, cum_k, seed, offset
      const int64_t query_row = p[i][kPrefixQueryRow], queries = p[i][kPrefixQueries];
      const int64_t key_row = p[i][kPrefixKeyRow], keys = p[i][kPrefixKeys];
      const at::Tensor q = by_call(q_rows.narrow(0, query_row, queries), 1, queries);
      const at::Tensor k = by_call(k_rows.narrow(0, key_row, keys), 1, keys);
      const at::Tensor v = by_call(v_rows.narrow(0, key_row, keys), 1, keys);
      // The merged output and log-sum-exp: P of these keys is then their
      // share of the whole softmax, and softmax's backward term (Σ dO·O) the
      // whole row's.
      std::vector<int64_t> sizes = lse_sizes;
      sizes[2] = queries;  // [1, heads, queries(, 1)]
      const at::Tensor call_lse = lse.narrow(0, query_row, queries).t().contiguous().view(sizes);
      auto r = at::_scaled_dot_product_cudnn_attention_backward(
          by_call(grad_out.narrow(0, query_row, queries), 1, queries), q, k, v,
          by_call(out.narrow(0, query_row, queries), 1, queries), call_lse, call[2], call[3], at::Tensor(), call[0],
          call[1], max_q[static_cast<size_t>(i)], max_k[static_cast<size_t>(i)], /*dropout_p=*/0.0,
          /*is_causal=*/false, scale);
      g.dq.narrow(0, query_row, queries).add_(as_rows(std::get<0>(r)));
      g.dk.narrow(0, key_row, keys).add_(as_rows(std::get<1>(r)));
      g.dv.narrow(0, key_row, keys).add_(as_rows(std::get<2>(r)));
    }
#endif
    return {g.dq, g.dk, g.dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

AttentionKeeps attention_keeps_named(const std::string& name) {
  if (name == "auto") return AttentionKeeps::kAuto;
  if (name == "rows") return AttentionKeeps::kRows;
  if (name == "calls") return AttentionKeeps::kCalls;
  throw std::invalid_argument("attention_keeps: '" + name + "' is not auto, rows or calls");
}

at::Tensor attend(const at::Tensor& q, at::Tensor k, at::Tensor v, const at::Tensor& bias, int64_t heads, int64_t kv_heads,
                  bool cudnn) {
#if DFLASH_DRAFTER_CUDNN_ATTENTION
  if (cudnn) {
    const bool grad = c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
    return std::get<0>(at::_scaled_dot_product_cudnn_attention(q, k, v, optional_bias(bias), /*compute_log_sumexp=*/grad,
                                                               /*dropout_p=*/0.0, /*is_causal=*/false,
                                                               /*return_debug_mask=*/false, scale_of(q)));
  }
#else
  (void)cudnn;
#endif
  if (heads > kv_heads) {
    k = k.repeat_interleave(heads / kv_heads, -3);
    v = v.repeat_interleave(heads / kv_heads, -3);
  }
  return compat::scaled_dot_product_attention(q, k, v, optional_bias(bias), /*is_causal=*/false);
}

at::Tensor additive_mask(const at::Tensor& allowed, const at::TensorOptions& options) {
  const int64_t keys = allowed.size(-1), padded = (keys + 15) / 16 * 16;
  std::vector<int64_t> sizes = allowed.sizes().vec();
  sizes.back() = padded;
  at::Tensor bias = at::full(sizes, -std::numeric_limits<float>::infinity(), options);
  bias.narrow(-1, 0, keys).masked_fill_(allowed.to(options.device()), 0.0);
  return bias.narrow(-1, 0, keys);
}

namespace {

// How cuDNN's attention is checked against SDPA: through autograd (what
// attend does), or with its backward called by hand (AttentionKeepingRows).
enum class CudnnPath { kAutograd, kByHand };

// Whether cuDNN's attention, by `path`, agrees with SDPA on a small GQA
// problem with a ragged mask, forward and backward. A throw is a no.
bool cudnn_agrees_with_sdpa(CudnnPath path, const at::TensorOptions& options, int64_t heads, int64_t kv_heads,
                            int64_t head_dim) {
#if DFLASH_DRAFTER_CUDNN_ATTENTION
  try {
    const c10::AutoGradMode enable(true);
    const int64_t queries = 40, keys = 70;
    at::Tensor q = at::randn({1, heads, queries, head_dim}, options).requires_grad_(true);
    at::Tensor k = at::randn({1, kv_heads, keys, head_dim}, options).requires_grad_(true);
    at::Tensor v = at::randn({1, kv_heads, keys, head_dim}, options).requires_grad_(true);
    const at::Tensor allowed = at::rand({queries, keys}, options.dtype(at::kFloat)).lt(0.5).logical_or(
        at::eye(queries, keys, options.dtype(at::kBool)));
    const at::Tensor bias = additive_mask(allowed, options).view({1, 1, queries, keys});
    const at::Tensor grad_out = at::randn({1, heads, queries, head_dim}, options);
    // Output, then dq, dk, dv.
    auto results = [&](const at::Tensor& out) {
      const auto grads = torch::autograd::grad({out}, {q, k, v}, {grad_out});
      return std::vector<at::Tensor>{out, grads[0], grads[1], grads[2]};
    };
    const std::vector<at::Tensor> reference = results(attend(q, k, v, bias, heads, kv_heads, /*cudnn=*/false));
    at::Tensor out;
    if (path == CudnnPath::kByHand) {
      const at::TensorOptions index = options.dtype(at::kLong);
      out = attention_keeping_rows(as_rows(q), as_rows(k), as_rows(v),
                                   {{1, queries, keys, at::arange(queries, index), at::arange(keys, index), bias}}, heads,
                                   kv_heads, /*cudnn=*/true)[0];
    } else {
      out = attend(q, k, v, bias, heads, kv_heads, /*cudnn=*/true);
    }
    const std::vector<at::Tensor> tried = results(out);
    for (size_t i = 0; i < tried.size(); ++i) {
      const at::Tensor x = tried[i].to(at::kFloat), ref = reference[i].to(at::kFloat);
      if ((x - ref).abs().max().item<double>() > 3e-2 * ref.abs().max().item<double>() + 1e-3) return false;
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
#else
  (void)path, (void)options, (void)heads, (void)kv_heads, (void)head_dim;
  return false;
#endif
}

}  // namespace

// Each asked once per process; the by-hand check only where rows are kept,
// so runs that keep calls start as before.
bool cudnn_attention_works(const at::TensorOptions& options, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  static const bool works = cudnn_agrees_with_sdpa(CudnnPath::kAutograd, options, heads, kv_heads, head_dim);
  return works;
}

bool cudnn_attention_backward_by_hand_works(const at::TensorOptions& options, int64_t heads, int64_t kv_heads,
                                            int64_t head_dim) {
  static const bool works = cudnn_attention_works(options, heads, kv_heads, head_dim) &&
                            cudnn_agrees_with_sdpa(CudnnPath::kByHand, options, heads, kv_heads, head_dim);
  return works;
}

std::vector<at::Tensor> attention_keeping_calls(const at::Tensor& q_rows, const at::Tensor& k_rows, const at::Tensor& v_rows,
                                                const std::vector<AttentionCall>& calls, int64_t heads, int64_t kv_heads,
                                                bool cudnn) {
  std::vector<at::Tensor> query_index, key_index;
  for (const AttentionCall& c : calls) query_index.push_back(c.query_index), key_index.push_back(c.key_index);
  const std::vector<at::Tensor> q = gather_rows(q_rows, query_index, /*disjoint=*/true);
  const std::vector<at::Tensor> k = gather_rows(k_rows, key_index, /*disjoint=*/false);
  const std::vector<at::Tensor> v = gather_rows(v_rows, key_index, /*disjoint=*/false);
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < calls.size(); ++i) {
    const AttentionCall& c = calls[i];
    outs.push_back(attend(by_call(q[i], c.count, c.queries), by_call(k[i], c.count, c.keys), by_call(v[i], c.count, c.keys),
                          c.bias, heads, kv_heads, cudnn));
  }
  return outs;
}

std::vector<at::Tensor> attention_keeping_rows(const at::Tensor& q_rows, const at::Tensor& k_rows, const at::Tensor& v_rows,
                                               const std::vector<AttentionCall>& calls, int64_t heads, int64_t kv_heads,
                                               bool cudnn) {
  return AttentionKeepingRows::apply(q_rows, k_rows, v_rows, calls, heads, kv_heads, cudnn);
}

at::Tensor prefix_block_attention(const at::Tensor& q_rows, const at::Tensor& k_rows, const at::Tensor& v_rows,
                                  const at::Tensor& prefixes, const at::Tensor& blocks, const at::Tensor& tiles) {
  return PrefixBlockAttention::apply(q_rows, k_rows, v_rows, prefixes, blocks, tiles)[0];
}

}  // namespace dflash::drafter
