#include "kernel_ops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#if DFLASH_CUDA_KERNELS
#include "block_attention.h"
#include "cuda_kernels.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dflash::kernel_ops {

#if DFLASH_CUDA_KERNELS
namespace {

cuda_kernels::Element element_of(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? cuda_kernels::Element::kBFloat16 : cuda_kernels::Element::kFloat16;
}
cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
const void* data_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace

static_assert(kInvariantMaxRows == cuda_kernels::kInvariantMaxRows, "one bound, stated in both headers");

bool available() { return true; }

bool runs_on(const at::Tensor& like) {
  return like.is_cuda() && (like.scalar_type() == at::kBFloat16 || like.scalar_type() == at::kHalf);
}

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps, const at::Tensor& out_in) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  if (out_in.defined() && (!out_in.is_contiguous() || out_in.sizes() != x.sizes() || out_in.scalar_type() != x.scalar_type() ||
                           out_in.device() != x.device()))
    throw std::invalid_argument("rms_norm: out must be contiguous and shaped like x " + c10::str(x.sizes()) + "; got " +
                                c10::str(out_in.sizes()));
  at::Tensor out = out_in.defined() ? out_in : at::empty_like(x);
  const int64_t width = x.size(-1);
  cuda_kernels::rms_norm(element_of(x), x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() / width, width,
                         static_cast<float>(eps), stream_of(x));
  return out;
}

HeadTensors qk_norm_rope(const at::Tensor& qkv_in, const at::Tensor& q_norm, const at::Tensor& k_norm,
                         const at::Tensor& cos, const at::Tensor& sin, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, double eps) {
  const c10::cuda::CUDAGuard guard(qkv_in.device());
  const at::Tensor qkv = qkv_in.contiguous();
  const int64_t tokens = qkv.size(0);
  HeadTensors out{at::empty({tokens, heads, head_dim}, qkv.options()), at::empty({tokens, kv_heads, head_dim}, qkv.options()),
                  at::empty({tokens, kv_heads, head_dim}, qkv.options())};
  cuda_kernels::qk_norm_rope(element_of(qkv), qkv.data_ptr(), data_or_null(q_norm), data_or_null(k_norm),
                             cos.data_ptr<float>(), sin.data_ptr<float>(), nullptr, nullptr, out.q.data_ptr(),
                             out.k.data_ptr(), out.v.data_ptr(), tokens, heads, kv_heads, head_dim, static_cast<float>(eps),
                             stream_of(qkv));
  return out;
}

at::Tensor qk_norm_rope_into_cache(const at::Tensor& qkv_in, const at::Tensor& q_norm, const at::Tensor& k_norm,
                                   const at::Tensor& cos_table, const at::Tensor& sin_table, const at::Tensor& positions,
                                   const at::Tensor& keys, const at::Tensor& values, const at::Tensor& slots, int64_t heads,
                                   int64_t kv_heads, int64_t head_dim, double eps) {
  const c10::cuda::CUDAGuard guard(qkv_in.device());
  const at::Tensor qkv = qkv_in.contiguous();
  const int64_t tokens = qkv.size(0);
  const auto fits = [&](const at::Tensor& t) {
    return t.is_contiguous() && t.device() == qkv.device() && t.scalar_type() == qkv.scalar_type() && t.dim() == 3 &&
           t.size(1) == kv_heads && t.size(2) == head_dim;
  };
  const auto indices = [&](const at::Tensor& t) {
    return t.is_contiguous() && t.device() == qkv.device() && t.scalar_type() == at::kLong && t.numel() == tokens;
  };
  const auto table = [&](const at::Tensor& t) {
    return t.is_contiguous() && t.device() == qkv.device() && t.scalar_type() == at::kFloat && t.size(-1) == head_dim / 2;
  };
  if (!fits(keys) || !fits(values) || keys.sizes() != values.sizes() || !indices(positions) || !indices(slots) ||
      !table(cos_table) || !table(sin_table))
    throw std::invalid_argument("qk_norm_rope_into_cache: needs contiguous caches [rows, " + std::to_string(kv_heads) + ", " +
                                std::to_string(head_dim) + "] in qkv's dtype, int64 positions and slots [" +
                                std::to_string(tokens) + "] and fp32 tables [positions, " + std::to_string(head_dim / 2) +
                                "] on qkv's device; got keys " + c10::str(keys.sizes()) + ", positions " +
                                c10::str(positions.sizes()) + ", cos " + c10::str(cos_table.sizes()));
  at::Tensor q = at::empty({tokens, heads, head_dim}, qkv.options());
  cuda_kernels::qk_norm_rope(element_of(qkv), qkv.data_ptr(), data_or_null(q_norm), data_or_null(k_norm),
                             cos_table.data_ptr<float>(), sin_table.data_ptr<float>(), positions.data_ptr<int64_t>(),
                             slots.data_ptr<int64_t>(), q.data_ptr(), keys.data_ptr(), values.data_ptr(), tokens, heads,
                             kv_heads, head_dim, static_cast<float>(eps), stream_of(qkv));
  return q;
}

at::Tensor swiglu(const at::Tensor& gate_up_in) {
  const c10::cuda::CUDAGuard guard(gate_up_in.device());
  const at::Tensor gate_up = gate_up_in.contiguous();
  const int64_t width = gate_up.size(-1) / 2, rows = gate_up.numel() / gate_up.size(-1);
  at::Tensor out = at::empty({rows, width}, gate_up.options());
  cuda_kernels::swiglu(element_of(gate_up), gate_up.data_ptr(), out.data_ptr(), rows, width, stream_of(gate_up));
  return out;
}

at::Tensor rms_norm_scaled(const at::Tensor& x_in, const at::Tensor& scale_in, double eps) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), scale = scale_in.to(at::kFloat).contiguous();
  const int64_t width = x.size(-1);
  if (scale.numel() != width)
    throw std::invalid_argument("rms_norm_scaled: scale has " + std::to_string(scale.numel()) + " entries for rows of " +
                                std::to_string(width));
  at::Tensor out = at::empty_like(x);
  cuda_kernels::rms_norm_scaled(element_of(x), x.data_ptr(), scale.data_ptr<float>(), out.data_ptr(), x.numel() / width,
                                width, static_cast<float>(eps), stream_of(x));
  return out;
}

at::Tensor gated_rms_norm(const at::Tensor& x_in, const at::Tensor& gate_in, const at::Tensor& weight_in, double eps) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t tokens = x.size(0), heads = x.size(1), width = x.size(2);
  at::Tensor gate = gate_in.to(x.scalar_type());
  if (gate.dim() != 2 || gate.size(0) != tokens || gate.size(1) != heads * width)
    throw std::invalid_argument("gated_rms_norm: gate " + c10::str(gate.sizes()) + " is not [" + std::to_string(tokens) +
                                ", " + std::to_string(heads * width) + "]");
  if (gate.stride(1) != 1) gate = gate.contiguous();
  const at::Tensor weight = weight_in.to(x.scalar_type()).contiguous();
  at::Tensor out = at::empty({tokens, heads * width}, x.options());
  cuda_kernels::gated_rms_norm(element_of(x), x.data_ptr(), gate.data_ptr(), weight.data_ptr(), out.data_ptr(),
                               tokens * heads, heads, width, gate.stride(0), static_cast<float>(eps), stream_of(x));
  return out;
}

at::Tensor causal_conv_silu(const at::Tensor& x_in, const at::Tensor& weight_in, const at::Tensor& prefix_in,
                            const at::Tensor& in_document_in) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.stride(2) == 1 ? x_in : x_in.contiguous();
  const int64_t rows = x.size(0), seq = x.size(1), channels = x.size(2), taps = weight_in.size(-1);
  const at::Tensor weight = weight_in.to(x.scalar_type()).reshape({channels, taps}).contiguous();
  const at::Tensor prefix = prefix_in.defined() ? prefix_in.to(x.scalar_type()).contiguous() : at::Tensor();
  if (prefix.defined() && (prefix.dim() != 3 || prefix.size(0) != rows || prefix.size(1) != taps - 1 ||
                           prefix.size(2) != channels))
    throw std::invalid_argument("causal_conv_silu: prefix " + c10::str(prefix.sizes()) + " is not [" +
                                std::to_string(rows) + ", " + std::to_string(taps - 1) + ", " +
                                std::to_string(channels) + "]");
  const at::Tensor in_document =
      in_document_in.defined() ? in_document_in.to(at::kInt).contiguous() : at::Tensor();
  at::Tensor out = at::empty({rows, seq, channels}, x.options());
  cuda_kernels::causal_conv_silu(element_of(x), x.data_ptr(), x.stride(0), x.stride(1), weight.data_ptr(),
                                 data_or_null(prefix), in_document.defined() ? in_document.data_ptr<int32_t>() : nullptr,
                                 out.data_ptr(), rows, seq, channels, taps, stream_of(x));
  return out;
}

NormForward rms_norm_with_rstd(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), w = weight.contiguous();
  const int64_t width = x.size(-1), rows = x.numel() / width;
  NormForward result{at::empty_like(x), at::empty({rows}, x.options().dtype(at::kFloat))};
  cuda_kernels::rms_norm(element_of(x), x.data_ptr(), w.data_ptr(), result.out.data_ptr(), rows, width,
                         static_cast<float>(eps), stream_of(x), result.rstd.data_ptr<float>());
  return result;
}

namespace {
// The weight's gradient from the kernels' fp32 partial sums [chunks, width].
at::Tensor weight_grad_from(const at::Tensor& partial, const at::Tensor& weight) {
  return partial.sum(0).to(weight.scalar_type());
}
}  // namespace

NormBackward rms_norm_backward(const at::Tensor& dy_in, const at::Tensor& x_in, const at::Tensor& weight,
                               const at::Tensor& rstd) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), dy = dy_in.contiguous().to(x.scalar_type()), w = weight.contiguous();
  const int64_t width = x.size(-1), rows = x.numel() / width;
  at::Tensor dx = at::empty_like(x);
  at::Tensor partial = at::empty({cuda_kernels::rms_norm_weight_chunks(rows, width), width}, x.options().dtype(at::kFloat));
  cuda_kernels::rms_norm_backward(element_of(x), dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                                  rstd.contiguous().data_ptr<float>(), dx.data_ptr(), partial.data_ptr<float>(), rows, width,
                                  stream_of(x));
  return {dx, weight_grad_from(partial, weight)};
}

namespace {
void check_head_tables(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t tokens = x.size(0), half = x.size(2) / 2;
  for (const at::Tensor* t : {&cos, &sin})
    if (t->scalar_type() != at::kFloat || !t->is_contiguous() || t->numel() != tokens * half || t->device() != x.device())
      throw std::invalid_argument("head_norm_rope: the rotary tables must be contiguous fp32 [" + std::to_string(tokens) +
                                  ", " + std::to_string(half) + "] on x's device; got " + c10::str(t->sizes()));
}
}  // namespace

NormForward head_norm_rope(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                           double eps) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), w = weight.contiguous();
  check_head_tables(x, cos, sin);
  const int64_t tokens = x.size(0), heads = x.size(1), head_dim = x.size(2);
  NormForward result{at::empty_like(x), at::empty({tokens, heads}, x.options().dtype(at::kFloat))};
  cuda_kernels::qk_norm_rope(element_of(x), x.data_ptr(), w.data_ptr(), nullptr, cos.data_ptr<float>(),
                             sin.data_ptr<float>(), nullptr, nullptr, result.out.data_ptr(), nullptr, nullptr, tokens, heads,
                             /*kv_heads=*/0, head_dim, static_cast<float>(eps), stream_of(x), result.rstd.data_ptr<float>());
  return result;
}

NormBackward head_norm_rope_backward(const at::Tensor& dout_in, const at::Tensor& x_in, const at::Tensor& weight,
                                     const at::Tensor& rstd, const at::Tensor& cos, const at::Tensor& sin) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), dout = dout_in.contiguous().to(x.scalar_type()), w = weight.contiguous();
  check_head_tables(x, cos, sin);
  const int64_t tokens = x.size(0), heads = x.size(1), head_dim = x.size(2);
  at::Tensor dx = at::empty_like(x), dn = at::empty_like(x);
  const at::Tensor r = rstd.contiguous();
  cuda_kernels::head_norm_rope_backward(element_of(x), dout.data_ptr(), x.data_ptr(), w.data_ptr(), r.data_ptr<float>(),
                                        cos.data_ptr<float>(), sin.data_ptr<float>(), dx.data_ptr(), dn.data_ptr(), tokens,
                                        heads, head_dim, stream_of(x));
  const int64_t rows = tokens * heads;
  at::Tensor partial = at::empty({cuda_kernels::rms_norm_weight_chunks(rows, head_dim), head_dim}, x.options().dtype(at::kFloat));
  cuda_kernels::rms_norm_weight_grad(element_of(x), dn.data_ptr(), x.data_ptr(), r.data_ptr<float>(),
                                     partial.data_ptr<float>(), rows, head_dim, stream_of(x));
  return {dx, weight_grad_from(partial, weight)};
}

at::Tensor swiglu_backward(const at::Tensor& gate_up_in, const at::Tensor& d_out_in) {
  const c10::cuda::CUDAGuard guard(gate_up_in.device());
  const at::Tensor gate_up = gate_up_in.contiguous(), d_out = d_out_in.contiguous().to(gate_up.scalar_type());
  const int64_t width = gate_up.size(-1) / 2, rows = gate_up.numel() / gate_up.size(-1);
  at::Tensor d_gate_up = at::empty_like(gate_up);
  cuda_kernels::swiglu_backward(element_of(gate_up), gate_up.data_ptr(), d_out.data_ptr(), d_gate_up.data_ptr(), rows, width,
                                stream_of(gate_up));
  return d_gate_up;
}

void move_cache_rows_(const std::vector<at::Tensor>& caches, int64_t row_numel, const std::vector<int64_t>& from,
                      int64_t to_start) {
  if (caches.empty() || from.empty()) return;
  const at::Tensor& first = caches.front();
  const int64_t rows = row_numel > 0 ? first.numel() / row_numel : 0;
  for (const at::Tensor& cache : caches)
    if (!cache.is_cuda() || !cache.is_contiguous() || cache.device() != first.device() || row_numel < 1 ||
        cache.numel() != rows * row_numel || cache.scalar_type() != first.scalar_type())
      throw std::invalid_argument("move_cache_rows_: caches must be contiguous CUDA tensors on one device, of one dtype "
                                  "and " + std::to_string(rows) + " rows of " + std::to_string(row_numel) + " elements; got " +
                                  c10::str(cache.sizes()));
  for (size_t j = 0; j < from.size(); ++j) {
    const int64_t to = to_start + static_cast<int64_t>(j);
    if (from[j] < to || (j > 0 && from[j] <= from[j - 1]) || from[j] >= rows)
      throw std::invalid_argument("move_cache_rows_: move " + std::to_string(j) + " takes row " + std::to_string(from[j]) +
                                  " to row " + std::to_string(to) + "; sources must increase, never fall below their "
                                  "destinations and stay below the caches' " + std::to_string(rows) + " rows");
  }
  const c10::cuda::CUDAGuard guard(first.device());
  cuda_kernels::CacheRowMoves moves;
  moves.row_bytes = row_numel * static_cast<int64_t>(first.element_size());
  const auto stream = stream_of(first);
  // Sources past a chunk's end keep their rows until that chunk moves them:
  // moves run in order, so the chunks do too.
  for (size_t m = 0; m < from.size(); m += cuda_kernels::kMaxCacheRowMoves) {
    const size_t m_end = std::min(from.size(), m + static_cast<size_t>(cuda_kernels::kMaxCacheRowMoves));
    moves.moves = static_cast<int32_t>(m_end - m);
    moves.to_start = to_start + static_cast<int64_t>(m);
    std::copy(from.begin() + static_cast<std::ptrdiff_t>(m), from.begin() + static_cast<std::ptrdiff_t>(m_end), moves.from);
    for (size_t b = 0; b < caches.size(); b += cuda_kernels::kMaxCacheRowBuffers) {
      const size_t b_end = std::min(caches.size(), b + static_cast<size_t>(cuda_kernels::kMaxCacheRowBuffers));
      moves.buffers_used = static_cast<int32_t>(b_end - b);
      for (size_t i = b; i < b_end; ++i) moves.buffers[i - b] = caches[i].data_ptr();
      cuda_kernels::move_cache_rows(moves, stream);
    }
  }
}

InvariantLinearProducts invariant_linear_products(const at::Tensor& on) {
  const c10::cuda::CUDAGuard guard(on.device());
  return {cuda_kernels::invariant_linear_runs_wgmma(), cuda_kernels::invariant_linear_device_code_has_wgmma(),
          cuda_kernels::current_compute_capability()};
}

bool invariant_linear_fits(const at::Tensor& x, const at::Tensor& weight) {
  return runs_on(x) && x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1) && x.is_contiguous() &&
         weight.is_contiguous() && weight.scalar_type() == x.scalar_type() &&
         cuda_kernels::invariant_linear_fits(x.size(0), x.size(1), x.data_ptr(), weight.data_ptr());
}

namespace {
void check_invariant_linear(const at::Tensor& x, const at::Tensor& weight) {
  if (!invariant_linear_fits(x, weight))
    throw std::invalid_argument("invariant_linear: needs contiguous CUDA bf16/fp16 x [rows, in] and weight [out, in] "
                                "with in a multiple of 8; got x " + c10::str(x.sizes()) + ", weight " +
                                c10::str(weight.sizes()));
}

// The fp32 partial sums of k's runs invariant_linear needs for x · weightᵀ
// (undefined where the weight's shape is summed in one run, or its runs are
// added in a cluster).
at::Tensor linear_workspace(const at::Tensor& x, const at::Tensor& weight) {
  if (cuda_kernels::invariant_linear_adds_runs_in_cluster(element_of(x), x.size(0), weight.size(0), weight.size(1)))
    return at::Tensor();
  const int64_t floats = cuda_kernels::invariant_linear_workspace_floats(x.size(0), weight.size(0), weight.size(1));
  return floats == 0 ? at::Tensor() : at::empty({floats}, x.options().dtype(at::kFloat));
}

float* float_data_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
}  // namespace

bool invariant_linear_adds_runs_in_cluster(const at::Tensor& x, const at::Tensor& weight) {
  check_invariant_linear(x, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  return cuda_kernels::invariant_linear_adds_runs_in_cluster(element_of(x), x.size(0), weight.size(0), weight.size(1));
}

void set_invariant_linear_most_cluster_runs(int most) { cuda_kernels::set_invariant_linear_most_cluster_runs(most); }
void set_invariant_linear_warpgroups(int warpgroups) { cuda_kernels::set_invariant_linear_warpgroups(warpgroups); }

at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& residual) {
  check_invariant_linear(x, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), out_features = weight.size(0);
  at::Tensor out = at::empty({rows, out_features}, x.options());
  const at::Tensor r = residual.defined() ? residual.contiguous() : residual;
  const at::Tensor workspace = linear_workspace(x, weight);
  cuda_kernels::invariant_linear(element_of(x), x.data_ptr(), weight.data_ptr(), data_or_null(bias), data_or_null(r),
                                 out.data_ptr(), float_data_or_null(workspace), rows, out_features, x.size(1),
                                 stream_of(x));
  return out;
}

void invariant_add_linear_(at::Tensor& residual, const at::Tensor& a, const at::Tensor& weight) {
  check_invariant_linear(a, weight);
  if (!residual.is_contiguous() || residual.sizes() != at::IntArrayRef{a.size(0), weight.size(0)})
    throw std::invalid_argument("invariant_add_linear_: the residual must be contiguous [rows, out]");
  const c10::cuda::CUDAGuard guard(a.device());
  const at::Tensor workspace = linear_workspace(a, weight);
  cuda_kernels::invariant_linear(element_of(a), a.data_ptr(), weight.data_ptr(), nullptr, residual.data_ptr(),
                                 residual.data_ptr(), float_data_or_null(workspace), a.size(0), weight.size(0), a.size(1),
                                 stream_of(a));
}

at::Tensor invariant_decode_attention(const at::Tensor& q_in, const at::Tensor& keys, const at::Tensor& values,
                                      const at::Tensor& cu_k, const at::Tensor& seqused_k, int64_t n, int64_t capacity,
                                      const at::Tensor& tree_rows, const at::Tensor& tree_lengths,
                                      const cuda_kernels::AttentionTiling& tiling) {
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous();
  const int64_t tokens = q.size(0), heads = q.size(1), head_dim = q.size(2), kv_heads = keys.size(1);
  if (!invariant_decode_attention_fits(head_dim, capacity) || !keys.is_contiguous() || !values.is_contiguous() ||
      cu_k.scalar_type() != at::kInt || seqused_k.scalar_type() != at::kInt || heads % kv_heads != 0)
    throw std::invalid_argument("invariant_decode_attention: unsupported head_dim " + std::to_string(head_dim) +
                                " or capacity " + std::to_string(capacity) + ", or inputs not as documented");
  cuda_kernels::DecodeTree tree;
  if (tree_rows.defined()) {
    if (tree_rows.scalar_type() != at::kInt || tree_lengths.scalar_type() != at::kInt || tree_rows.dim() != 2 ||
        tree_rows.size(0) != tokens || tree_lengths.numel() != tokens || !tree_rows.is_contiguous() ||
        !tree_lengths.is_contiguous() || tree_rows.device() != q.device() || tree_lengths.device() != q.device())
      throw std::invalid_argument("invariant_decode_attention: a tree needs int32 rows [tokens, depth] and lengths [tokens], "
                                  "contiguous on the queries' device");
    tree.rows = tree_rows.data_ptr<int32_t>();
    tree.lengths = tree_lengths.data_ptr<int32_t>();
    tree.stride = tree_rows.size(1);
  }
  at::Tensor out = at::empty({tokens, heads * head_dim}, q.options());
  cuda_kernels::invariant_decode_attention(element_of(q), q.data_ptr(), keys.data_ptr(), values.data_ptr(),
                                           cu_k.data_ptr<int32_t>(), seqused_k.data_ptr<int32_t>(), tree, out.data_ptr(),
                                           tokens, n, heads, kv_heads, head_dim, capacity, stream_of(q), tiling);
  return out;
}

bool invariant_decode_attention_fits(int64_t head_dim, int64_t capacity) {
  return cuda_kernels::invariant_decode_attention_fits(head_dim, capacity);
}

bool block_attention_fits(const at::Tensor& like, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size) {
  return like.is_cuda() && like.scalar_type() == at::kBFloat16 &&
         cuda_kernels::block_kernel_shape_fits(heads, kv_heads, head_dim, block_size);
}

namespace {
void check_block_tables(const at::Tensor& blocks, const at::Tensor& tiles) {
  auto table = [](const at::Tensor& t, int64_t columns, const char* what) {
    if (t.defined() && (!t.is_cuda() || t.scalar_type() != at::kLong || t.dim() != 2 || t.size(1) != columns ||
                        !t.is_contiguous()))
      throw std::invalid_argument(std::string("block attention: ") + what + " must be a contiguous CUDA int64 [n, " +
                                  std::to_string(columns) + "] tensor");
  };
  table(blocks, cuda_kernels::kBlockKeysFields, "blocks");
  table(tiles, cuda_kernels::kKeyTileInt64s, "tiles");
}
const cuda_kernels::BlockKeys* block_keys(const at::Tensor& blocks) {
  return reinterpret_cast<const cuda_kernels::BlockKeys*>(blocks.data_ptr<int64_t>());
}
}  // namespace

BlockAttentionForward block_attention_forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                              const at::Tensor& blocks, const at::Tensor& prior_out,
                                              const at::Tensor& prior_lse, double scale) {
  if (!block_attention_fits(q_in, q_in.size(1), k_in.size(1), q_in.size(2), cuda_kernels::kEntryRows))
    throw std::invalid_argument("block_attention_forward: needs CUDA bf16 rows with head_dim 128 and 4 query heads per KV "
                                "head; got q " + c10::str(q_in.sizes()) + " " + c10::toString(q_in.scalar_type()) + ", k " +
                                c10::str(k_in.sizes()));
  const c10::cuda::CUDAGuard guard(q_in.device());
  check_block_tables(blocks, at::Tensor());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const int64_t heads = q.size(1), kv_heads = k.size(1), head_dim = q.size(2);
  if (prior_out.defined() != prior_lse.defined() ||
      (prior_out.defined() && (!prior_out.is_contiguous() || prior_out.sizes() != q.sizes() ||
                               prior_lse.scalar_type() != at::kFloat || !prior_lse.is_contiguous() ||
                               prior_lse.sizes() != at::IntArrayRef{q.size(0), heads})))
    throw std::invalid_argument("block_attention_forward: prior_out must be contiguous like q and prior_lse fp32 [rows, heads]");
  BlockAttentionForward r{at::empty_like(q), at::empty({q.size(0), heads}, q.options().dtype(at::kFloat))};
  cuda_kernels::block_attention_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), r.out.data_ptr(), r.lse.data_ptr<float>(),
                                        data_or_null(prior_out),
                                        prior_lse.defined() ? prior_lse.data_ptr<float>() : nullptr, block_keys(blocks),
                                        blocks.size(0), heads, kv_heads, head_dim, static_cast<float>(scale),
                                        stream_of(q));
  return r;
}

BlockAttentionGrads block_attention_backward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                             const at::Tensor& out_in, const at::Tensor& lse_in,
                                             const at::Tensor& grad_out_in, const at::Tensor& blocks,
                                             const at::Tensor& tiles, double scale) {
  const c10::cuda::CUDAGuard guard(q_in.device());
  check_block_tables(blocks, tiles);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), out = out_in.contiguous();
  const at::Tensor lse = lse_in.contiguous(), grad_out = grad_out_in.contiguous().to(q.scalar_type());
  const int64_t heads = q.size(1), kv_heads = k.size(1), head_dim = q.size(2);
  BlockAttentionGrads g{at::empty_like(q), at::empty_like(k), at::empty_like(v)};
  at::Tensor delta = at::empty({q.size(0), heads}, q.options().dtype(at::kFloat));
  cuda_kernels::block_attention_backward(
      q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), grad_out.data_ptr(), lse.data_ptr<float>(),
      delta.data_ptr<float>(), g.dq.data_ptr(), g.dk.data_ptr(), g.dv.data_ptr(), block_keys(blocks), blocks.size(0),
      reinterpret_cast<const cuda_kernels::KeyTile*>(tiles.data_ptr<int64_t>()), tiles.size(0), q.size(0), k.size(0), heads,
      kv_heads, head_dim, static_cast<float>(scale), stream_of(q));
  return g;
}

#else  // no CUDA kernels in this build

namespace {
[[noreturn]] void unavailable() { throw std::logic_error("dflash: this build has no CUDA kernels"); }
}  // namespace

bool available() { return false; }
bool runs_on(const at::Tensor&) { return false; }
at::Tensor rms_norm(const at::Tensor&, const at::Tensor&, double, const at::Tensor&) { unavailable(); }
HeadTensors qk_norm_rope(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         int64_t, int64_t, int64_t, double) {
  unavailable();
}
at::Tensor qk_norm_rope_into_cache(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, int64_t, int64_t, int64_t, double) {
  unavailable();
}
at::Tensor swiglu(const at::Tensor&) { unavailable(); }
at::Tensor rms_norm_scaled(const at::Tensor&, const at::Tensor&, double) { unavailable(); }
at::Tensor gated_rms_norm(const at::Tensor&, const at::Tensor&, const at::Tensor&, double) { unavailable(); }
at::Tensor causal_conv_silu(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) { unavailable(); }
NormForward rms_norm_with_rstd(const at::Tensor&, const at::Tensor&, double) { unavailable(); }
NormBackward rms_norm_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) { unavailable(); }
NormForward head_norm_rope(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
  unavailable();
}
NormBackward head_norm_rope_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, const at::Tensor&) {
  unavailable();
}
at::Tensor swiglu_backward(const at::Tensor&, const at::Tensor&) { unavailable(); }
void move_cache_rows_(const std::vector<at::Tensor>&, int64_t, const std::vector<int64_t>&, int64_t) { unavailable(); }
InvariantLinearProducts invariant_linear_products(const at::Tensor&) { unavailable(); }
bool invariant_linear_fits(const at::Tensor&, const at::Tensor&) { return false; }
bool invariant_linear_adds_runs_in_cluster(const at::Tensor&, const at::Tensor&) { return false; }
void set_invariant_linear_most_cluster_runs(int) { unavailable(); }
void set_invariant_linear_warpgroups(int) { unavailable(); }
at::Tensor invariant_linear(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) { unavailable(); }
void invariant_add_linear_(at::Tensor&, const at::Tensor&, const at::Tensor&) { unavailable(); }
at::Tensor invariant_decode_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, int64_t, int64_t, const at::Tensor&, const at::Tensor&,
                                      const cuda_kernels::AttentionTiling&) {
  unavailable();
}
bool invariant_decode_attention_fits(int64_t, int64_t) { return false; }
bool block_attention_fits(const at::Tensor&, int64_t, int64_t, int64_t, int64_t) { return false; }
BlockAttentionForward block_attention_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                              const at::Tensor&, const at::Tensor&, double) {
  unavailable();
}
BlockAttentionGrads block_attention_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                             const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                             double) {
  unavailable();
}

#endif

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, bool invariant) {
  if (!invariant) return at::linear(x, weight, bias);
  at::Tensor rows = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
  if (!invariant_linear_fits(rows, weight)) rows = rows.clone(at::MemoryFormat::Contiguous);  // strided or unaligned
  const at::Tensor out = invariant_linear(rows, weight, bias);
  if (x.dim() == 2) return out;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return out.view(shape);
}


}  // namespace dflash::kernel_ops
