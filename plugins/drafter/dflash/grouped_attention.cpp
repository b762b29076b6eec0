#include "grouped_attention.h"

#include "row_gather.h"

#include <dflash/sdk/torch_compat.hpp>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <tuple>

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

#if DFLASH_DRAFTER_CUDNN_ATTENTION
// One cuDNN attention forward and what its backward takes besides q, k, v.
struct CudnnPart {
  at::Tensor out, lse, cum_q, cum_k, seed, offset;
  int64_t max_q = 0, max_k = 0;
};

CudnnPart cudnn_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias) {
  auto r = at::_scaled_dot_product_cudnn_attention(q, k, v, optional_bias(bias), /*compute_log_sumexp=*/true,
                                                   /*dropout_p=*/0.0, /*is_causal=*/false,
                                                   /*return_debug_mask=*/false, scale_of(q));
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r),        std::get<3>(r),
          std::get<6>(r), std::get<7>(r), as_int(std::get<4>(r)), as_int(std::get<5>(r))};
}

// dq, dk, dv of one part, given the output and log-sum-exp of the whole
// attention: softmax's backward needs only each pair's probability (from
// the whole log-sum-exp) and rowsum(dO ∘ O) of the whole output.
std::tuple<at::Tensor, at::Tensor, at::Tensor> cudnn_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                                              const at::Tensor& v, const at::Tensor& out,
                                                              const at::Tensor& lse, const CudnnPart& part,
                                                              const at::Tensor& bias) {
  return at::_scaled_dot_product_cudnn_attention_backward(grad, q, k, v, out, lse, part.seed, part.offset, bias, part.cum_q,
                                                          part.cum_k, part.max_q, part.max_k, /*dropout_p=*/0.0,
                                                          /*is_causal=*/false, scale_of(q));
}

// Two attentions of the same queries over disjoint keys, as one: the
// log-sum-exp of both and each output weighted by its share of it.
void merge_into(CudnnPart& a, const CudnnPart& b) {
  const at::Tensor lse = at::logaddexp(a.lse, b.lse);
  at::Tensor wa = (a.lse - lse).exp(), wb = (b.lse - lse).exp();
  if (wa.dim() == a.out.dim() - 1) wa = wa.unsqueeze(-1), wb = wb.unsqueeze(-1);  // over d
  at::Tensor out = at::empty_like(a.out);  // cuDNN's layout, as backward expects it
  out.copy_(a.out.to(at::kFloat).mul_(wa).add_(b.out.to(at::kFloat).mul_(wb)));
  a.out = out, a.lse = lse;
}
#endif

// The keys a call may take without a mask: its groups' dense_keys, on a
// 16-element boundary (the kernels want aligned key and bias pointers), and
// never every key (its own slots are always masked).
int64_t unmasked_keys(const AttentionCall& c) { return std::min(c.dense_keys, c.keys - 1) / 16 * 16; }

// Per call, what backward needs beside the rows: the output, its
// log-sum-exp and, per part (the unmasked leading keys, then the rest; only
// the first part where the call is not split), cuDNN's other returns
// (undefined off cuDNN).
constexpr size_t kPartExtras = 4;                        // cum_seq_q, cum_seq_k, philox_seed, philox_offset
constexpr size_t kSavedPerCall = 2 + 2 * kPartExtras;    // out, lse, then both parts' extras
constexpr size_t kRows = 3;                              // q, k, v rows first

class AttentionKeepingRows : public torch::autograd::Function<AttentionKeepingRows> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q_rows,
                                                const at::Tensor& k_rows, const at::Tensor& v_rows,
                                                const std::vector<AttentionCall>& calls, int64_t heads, int64_t kv_heads,
                                                bool cudnn) {
    (void)cudnn;  // without cuDNN attention in this LibTorch, every call is attend's
    torch::autograd::variable_list outs;
    std::vector<at::Tensor> saved = {q_rows, k_rows, v_rows};
    std::vector<int64_t> max_q, max_k, split;  // per part: max_q, max_k; per call: its unmasked keys (0: one part)
    std::vector<at::Tensor> query_index, key_index, biases;
    for (const AttentionCall& c : calls) {
      const at::Tensor q = by_call(q_rows.index_select(0, c.query_index), c.count, c.queries);
      const at::Tensor k = by_call(k_rows.index_select(0, c.key_index), c.count, c.keys);
      const at::Tensor v = by_call(v_rows.index_select(0, c.key_index), c.count, c.keys);
      std::vector<at::Tensor> extras(2 * kPartExtras);
      at::Tensor out, lse;
      int64_t unmasked = 0;
#if DFLASH_DRAFTER_CUDNN_ATTENTION
      if (cudnn) {
        // The leading keys every query sees without a mask (about twice as
        // fast), the rest with it; one masked call where there are none.
        unmasked = unmasked_keys(c);
        std::vector<CudnnPart> parts;
        if (unmasked > 0) {
          const int64_t rest = c.keys - unmasked;
          parts.push_back(cudnn_forward(q, k.narrow(2, 0, unmasked), v.narrow(2, 0, unmasked), at::Tensor()));
          parts.push_back(cudnn_forward(q, k.narrow(2, unmasked, rest), v.narrow(2, unmasked, rest),
                                        c.bias.narrow(-1, unmasked, rest)));
          merge_into(parts[0], parts[1]);
        } else {
          parts.push_back(cudnn_forward(q, k, v, c.bias));
        }
        out = parts[0].out, lse = parts[0].lse;
        for (size_t p = 0; p < parts.size(); ++p) {
          const CudnnPart& part = parts[p];
          std::copy_n(std::vector<at::Tensor>{part.cum_q, part.cum_k, part.seed, part.offset}.begin(), kPartExtras,
                      extras.begin() + static_cast<std::ptrdiff_t>(p * kPartExtras));
          max_q.push_back(part.max_q), max_k.push_back(part.max_k);
        }
      }
#endif
      if (!out.defined()) out = attend(q, k, v, c.bias, heads, kv_heads, /*cudnn=*/false);
      outs.push_back(out);
      saved.insert(saved.end(), {out, lse});
      saved.insert(saved.end(), extras.begin(), extras.end());
      split.push_back(unmasked);
      query_index.push_back(c.query_index), key_index.push_back(c.key_index), biases.push_back(c.bias);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["query_index"] = query_index;
    ctx->saved_data["key_index"] = key_index;
    ctx->saved_data["bias"] = biases;
    ctx->saved_data["max_q"] = max_q;
    ctx->saved_data["max_k"] = max_k;
    ctx->saved_data["split"] = split;
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
    [[maybe_unused]] const std::vector<int64_t> max_q = ctx->saved_data["max_q"].toIntVector(),
                                                max_k = ctx->saved_data["max_k"].toIntVector();
    const std::vector<int64_t> split = ctx->saved_data["split"].toIntVector();
    const int64_t heads = ctx->saved_data["heads"].toInt(), kv_heads = ctx->saved_data["kv_heads"].toInt();
    [[maybe_unused]] const bool cudnn = ctx->saved_data["cudnn"].toBool();
    at::Tensor dq_rows = at::zeros_like(q_rows), dk_rows = at::zeros_like(k_rows), dv_rows = at::zeros_like(v_rows);
    [[maybe_unused]] size_t part = 0;  // the next cuDNN part's max_q and max_k
    for (size_t i = 0; i < grads.size(); ++i) {
      const at::Tensor* call = &saved[kRows + kSavedPerCall * i];  // out, lse, then the parts' extras
      const at::Tensor& out = call[0];
      const int64_t count = out.size(0), queries = out.size(2), keys = key_index[i].numel() / count;
      [[maybe_unused]] const size_t parts = split[i] > 0 ? 2 : 1;
      if (!grads[i].defined()) {
        part += cudnn ? parts : 0;
        continue;
      }
      // The call's q, k and v, gathered again from the rows.
      at::Tensor q = by_call(q_rows.index_select(0, query_index[i]), count, queries);
      at::Tensor k = by_call(k_rows.index_select(0, key_index[i]), count, keys);
      at::Tensor v = by_call(v_rows.index_select(0, key_index[i]), count, keys);
      at::Tensor dq, dk, dv;
#if DFLASH_DRAFTER_CUDNN_ATTENTION
      if (cudnn) {
        auto part_of = [&](size_t p) {
          const at::Tensor* e = call + 2 + p * kPartExtras;
          CudnnPart r;
          r.cum_q = e[0], r.cum_k = e[1], r.seed = e[2], r.offset = e[3];
          r.max_q = max_q[part + p], r.max_k = max_k[part + p];
          return r;
        };
        const at::Tensor &o = call[0], &lse = call[1];
        if (parts == 2) {
          const int64_t unmasked = split[i], rest = keys - unmasked;
          auto [dq0, dk0, dv0] = cudnn_backward(grads[i], q, k.narrow(2, 0, unmasked), v.narrow(2, 0, unmasked), o, lse,
                                                part_of(0), at::Tensor());
          auto [dq1, dk1, dv1] = cudnn_backward(grads[i], q, k.narrow(2, unmasked, rest), v.narrow(2, unmasked, rest), o,
                                                lse, part_of(1), biases[i].narrow(-1, unmasked, rest));
          dq = dq0.add_(dq1), dk = at::cat({dk0, dk1}, 2), dv = at::cat({dv0, dv1}, 2);
        } else {
          std::tie(dq, dk, dv) = cudnn_backward(grads[i], q, k, v, o, lse, part_of(0), biases[i]);
        }
        part += parts;
      }
#endif
      if (!dq.defined()) {  // the call again, under autograd
        const c10::AutoGradMode enable(true);
        q = q.detach().requires_grad_(true), k = k.detach().requires_grad_(true), v = v.detach().requires_grad_(true);
        const auto g = torch::autograd::grad({attend(q, k, v, biases[i], heads, kv_heads, /*cudnn=*/false)}, {q, k, v},
                                             {grads[i]});
        dq = g[0], dk = g[1], dv = g[2];
      }
      dq_rows.index_copy_(0, query_index[i], as_rows(dq));  // the calls partition the queries
      dk_rows.index_add_(0, key_index[i], as_rows(dk));     // and share context keys
      dv_rows.index_add_(0, key_index[i], as_rows(dv));
    }
    return {dq_rows, dk_rows, dv_rows, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor attend(const at::Tensor& q, at::Tensor k, at::Tensor v, const at::Tensor& bias, int64_t heads, int64_t kv_heads,
                  bool cudnn) {
#if DFLASH_DRAFTER_CUDNN_ATTENTION
  if (cudnn) {
    const bool grad = c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
    return std::get<0>(at::_scaled_dot_product_cudnn_attention(q, k, v, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt,
                                                               /*compute_log_sumexp=*/grad,
                                                               /*dropout_p=*/0.0, /*is_causal=*/false,
                                                               /*return_debug_mask=*/false,
                                                               1.0 / std::sqrt(static_cast<double>(q.size(-1)))));
  }
#else
  (void)cudnn;
#endif
  if (heads > kv_heads) {
    k = k.repeat_interleave(heads / kv_heads, -3);
    v = v.repeat_interleave(heads / kv_heads, -3);
  }
  return compat::scaled_dot_product_attention(q, k, v, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt,
                                              /*is_causal=*/false);
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
// problem with a ragged mask, forward and backward; by hand, also with the
// leading keys unmasked (attention_keeping_rows' two parts). A throw is a no.
bool cudnn_agrees_with_sdpa(CudnnPath path, const at::TensorOptions& options, int64_t heads, int64_t kv_heads,
                            int64_t head_dim) {
#if DFLASH_DRAFTER_CUDNN_ATTENTION
  try {
    const c10::AutoGradMode enable(true);
    const int64_t queries = 40, keys = 70, unmasked = 32;
    at::Tensor q = at::randn({1, heads, queries, head_dim}, options).requires_grad_(true);
    at::Tensor k = at::randn({1, kv_heads, keys, head_dim}, options).requires_grad_(true);
    at::Tensor v = at::randn({1, kv_heads, keys, head_dim}, options).requires_grad_(true);
    at::Tensor allowed = at::rand({queries, keys}, options.dtype(at::kFloat)).lt(0.5).logical_or(
        at::eye(queries, keys, options.dtype(at::kBool)));
    if (path == CudnnPath::kByHand) allowed.narrow(1, 0, unmasked).fill_(true);
    const at::Tensor bias = additive_mask(allowed, options).view({1, 1, queries, keys});
    const at::Tensor grad_out = at::randn({1, heads, queries, head_dim}, options);
    // Output, then dq, dk, dv.
    auto results = [&](const at::Tensor& out) {
      const auto grads = torch::autograd::grad({out}, {q, k, v}, {grad_out});
      return std::vector<at::Tensor>{out, grads[0], grads[1], grads[2]};
    };
    auto agrees = [](const std::vector<at::Tensor>& tried, const std::vector<at::Tensor>& reference) {
      for (size_t i = 0; i < tried.size(); ++i) {
        const at::Tensor x = tried[i].to(at::kFloat), ref = reference[i].to(at::kFloat);
        if ((x - ref).abs().max().item<double>() > 3e-2 * ref.abs().max().item<double>() + 1e-3) return false;
      }
      return true;
    };
    const std::vector<at::Tensor> reference = results(attend(q, k, v, bias, heads, kv_heads, /*cudnn=*/false));
    if (path == CudnnPath::kAutograd) return agrees(results(attend(q, k, v, bias, heads, kv_heads, /*cudnn=*/true)), reference);
    const at::TensorOptions index = options.dtype(at::kLong);
    for (int64_t dense_keys : {int64_t{0}, unmasked}) {  // one masked call; unmasked leading keys and the rest
      const AttentionCall call{1, queries, keys, dense_keys, at::arange(queries, index), at::arange(keys, index), bias};
      const at::Tensor out =
          attention_keeping_rows(as_rows(q), as_rows(k), as_rows(v), {call}, heads, kv_heads, /*cudnn=*/true)[0];
      if (!agrees(results(out), reference)) return false;
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

}  // namespace dflash::drafter
