#include "drafting_fast_path.h"

#include <dflash/sdk/torch_compat.hpp>
#include <kernel_ops.h>

#include <c10/core/GradMode.h>

#include <cmath>
#include <stdexcept>
#include <utility>

#if DFLASH_TORCH_AT_LEAST(2, 5)
#include <ATen/ops/_flash_attention_forward.h>
#endif

namespace dflash::drafter {
namespace {

// The rotary table of positions [0, count): the reference path's numbers
// (rotary_tables in dflash_model.cpp: the angles in fp64 on the model's
// device, cos and sin rounded to the model's dtype), held as fp32 because the
// kernel reads fp32. The kernel rounds them to the activation dtype again,
// which then changes nothing: both paths rotate by the same values.
at::Tensor rotary_table(const DrafterShape& s, int64_t count, const c10::Device& device, c10::ScalarType dtype) {
  const auto doubles = at::TensorOptions().dtype(at::kDouble).device(device);
  const at::Tensor inv =
      1.0 / at::pow(s.rope_theta, at::arange(0, s.head_dim, 2, doubles) / static_cast<double>(s.head_dim));
  const at::Tensor angles = at::arange(count, doubles).unsqueeze(-1) * inv;  // [count, d/2]
  return at::stack({angles.cos(), angles.sin()}).to(dtype).to(at::kFloat).contiguous();
}

// The context's rotary table as the kernels read it: cos and sin, fp32
// [capacity, d/2] each (rows picked inside the kernel by position).
struct RotaryTables {
  at::Tensor cos, sin;
};
RotaryTables rotary_tables(const DraftContext& context) { return {context.rotary.select(0, 0), context.rotary.select(0, 1)}; }

// The block's queries q [Bs, heads, d] against the first cu_k[1] rows of one
// layer's cache [capacity, kv_heads, d]: no mask (a block sees its whole
// context and all of itself), GQA native. Returns [Bs, heads·d].
at::Tensor block_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& cu_q,
                           const at::Tensor& cu_k, int64_t max_keys) {
#if DFLASH_TORCH_AT_LEAST(2, 5)
  const int64_t slots = q.size(0), heads = q.size(1), head_dim = q.size(2);
  auto result = at::_flash_attention_forward(q, keys, values, cu_q, cu_k, slots, max_keys, /*dropout_p=*/0.0,
                                             /*is_causal=*/false, /*return_debug_mask=*/false,
                                             1.0 / std::sqrt(static_cast<double>(head_dim)));
  return std::get<0>(result).reshape({slots, heads * head_dim});
#else
  (void)q, (void)keys, (void)values, (void)cu_q, (void)cu_k, (void)max_keys;
  throw std::logic_error("dflash: fused drafting needs LibTorch >= 2.5 (flash attention)");
#endif
}

}  // namespace

bool DraftingFastPath::runs(const DFlashModel& model) {
  return kernel_ops::available() && kernel_ops::runs_on(model.fc_) && model.flash_drafting();
}

void DraftingFastPath::refresh_weights(const DFlashModel& model) {
  // Every way a parameter changes — the optimizer, a loaded checkpoint's
  // copy_ through parameters() — bumps its version counter.
  std::vector<int64_t> versions;
  versions.reserve(model.layers_.size() * 5);
  for (const DFlashModel::Layer& l : model.layers_)
    for (const at::Tensor* source : {&l.q, &l.k, &l.v, &l.gate, &l.up}) versions.push_back(source->_version());
  if (!fused_.empty() && versions == versions_) return;
  const c10::NoGradGuard no_grad;
  const bool first = fused_.empty();
  for (size_t i = 0; i < model.layers_.size(); ++i) {
    const DFlashModel::Layer& l = model.layers_[i];
    if (first) {
      fused_.push_back({at::cat({l.q, l.k, l.v}), at::cat({l.gate, l.up})});
    } else {  // in place: captured graphs read these addresses
      at::cat_out(fused_[i].qkv, {l.q, l.k, l.v}, 0);
      at::cat_out(fused_[i].gate_up, {l.gate, l.up}, 0);
    }
  }
  versions_ = std::move(versions);
}

void DraftingFastPath::prepare(const DFlashModel& model, DraftContext& context) {
  refresh_weights(model);
  const DrafterShape& s = model.shape_;
  const bool covers = context.rotary.defined() && context.rotary.size(1) >= context.capacity &&
                      context.rotary.size(2) == s.head_dim / 2;
  if (!covers) context.rotary = rotary_table(s, context.capacity, model.fc_.device(), model.fc_.scalar_type());
}

void DraftingFastPath::write_context(const DFlashModel& model, DraftContext& context, const at::Tensor& features,
                                     const at::Tensor& positions) {
  const c10::NoGradGuard no_grad;
  prepare(model, context);
  const DrafterShape& s = model.shape_;
  const double eps = s.rms_norm_eps;
  const at::Tensor fc = at::linear(features.to(model.fc_.device(), model.fc_.scalar_type()), model.fc_);
  const at::Tensor hidden = kernel_ops::rms_norm(fc, model.hidden_norm_, eps);  // [n, H]
  const RotaryTables rotary = rotary_tables(context);
  const int64_t q_width = s.heads * s.head_dim, kv_width = 2 * s.kv_heads * s.head_dim;
  for (size_t i = 0; i < fused_.size(); ++i) {
    // The context gives keys and values only: the [k; v] rows of the fused
    // projection, then k's norm and RoPE into the cache (the kernel with no query heads).
    const at::Tensor kv = at::linear(hidden, fused_[i].qkv.narrow(0, q_width, kv_width));
    kernel_ops::qk_norm_rope_into_cache(kv, at::Tensor(), model.layers_[i].k_norm, rotary.cos, rotary.sin, positions,
                                        context.keys[i], context.values[i], positions, 0, s.kv_heads, s.head_dim, eps);
  }
}

DraftingFastPath::BlockOffsets DraftingFastPath::block_offsets(const DraftContext& context, int64_t slots, int64_t host_keys,
                                                               const at::Tensor& base) {
  const auto ints = context.rotary.options().dtype(at::kInt);
  if (host_keys > 0) return {at::arange(0, 2 * slots, slots, ints), at::arange(0, 2 * host_keys, host_keys, ints), host_keys};
  return {at::arange(0, 2 * slots, slots, ints), at::cat({at::zeros({1}, base.options()), base + slots}).to(at::kInt),
          context.capacity};
}

at::Tensor DraftingFastPath::run_block(const DFlashModel& model, DraftContext& context, const at::Tensor& slot_embeddings,
                                       const at::Tensor& positions, int64_t host_keys, const at::Tensor& base) {
  const c10::NoGradGuard no_grad;
  prepare(model, context);
  const int64_t slots = slot_embeddings.size(0);
  const BlockOffsets offsets = block_offsets(context, slots, host_keys, base);
  at::Tensor x = slot_embeddings.to(model.fc_.device(), model.fc_.scalar_type());  // [Bs, H]; may be the caller's
  for (size_t i = 0; i < fused_.size(); ++i) {
    const at::Tensor normed = kernel_ops::rms_norm(x, model.layers_[i].input_norm, model.shape_.rms_norm_eps);
    x = finish_layer(model, context, i, x, block_queries(model, context, i, normed, positions), offsets);
  }
  return kernel_ops::rms_norm(x, model.final_norm_, model.shape_.rms_norm_eps);
}

at::Tensor DraftingFastPath::extend_and_run_block(const DFlashModel& model, DraftContext& context, const at::Tensor& features,
                                                  const at::Tensor& slot_embeddings, const ExtendAndDraftPositions& where) {
  const c10::NoGradGuard no_grad;
  prepare(model, context);
  const DrafterShape& s = model.shape_;
  const double eps = s.rms_norm_eps;
  const int64_t rows = features.size(0), slots = slot_embeddings.size(0);
  const BlockOffsets offsets = {at::arange(0, 2 * slots, slots, where.key_range.options().dtype(at::kInt)),
                                 where.key_range.to(at::kInt), context.capacity};
  // Rows [0, rows): the context's hidden states (fc, then its norm), the
  // same in every layer; rows [rows, rows + Bs): each layer's normed block.
  // One [q; k; v] GEMM and one rotary-and-cache kernel then serve both (the
  // context rows' queries are computed and dropped: cheaper than two calls).
  at::Tensor both = at::empty({rows + slots, s.hidden}, model.fc_.options());
  const at::Tensor fc = at::linear(features.to(model.fc_.device(), model.fc_.scalar_type()), model.fc_);
  kernel_ops::rms_norm(fc, model.hidden_norm_, eps, both.narrow(0, 0, rows));
  const at::Tensor block_rows = both.narrow(0, rows, slots);
  at::Tensor x = slot_embeddings.to(model.fc_.device(), model.fc_.scalar_type());  // [Bs, H]; may be the caller's
  for (size_t i = 0; i < fused_.size(); ++i) {
    kernel_ops::rms_norm(x, model.layers_[i].input_norm, eps, block_rows);
    const at::Tensor q = block_queries(model, context, i, both, where.all).narrow(0, rows, slots);
    x = finish_layer(model, context, i, x, q, offsets);
  }
  return kernel_ops::rms_norm(x, model.final_norm_, eps);
}

at::Tensor DraftingFastPath::block_queries(const DFlashModel& model, DraftContext& context, size_t layer,
                                           const at::Tensor& normed, const at::Tensor& positions) const {
  const DrafterShape& s = model.shape_;
  const DFlashModel::Layer& l = model.layers_[layer];
  const RotaryTables rotary = rotary_tables(context);
  const at::Tensor qkv = at::linear(normed, fused_[layer].qkv);
  // The rows' own keys and values go to the cache at their positions (the
  // block's right after the context, as on the ATen path).
  return kernel_ops::qk_norm_rope_into_cache(qkv, l.q_norm, l.k_norm, rotary.cos, rotary.sin, positions, context.keys[layer],
                                             context.values[layer], positions, s.heads, s.kv_heads, s.head_dim,
                                             s.rms_norm_eps);
}

at::Tensor DraftingFastPath::finish_layer(const DFlashModel& model, DraftContext& context, size_t layer, const at::Tensor& x,
                                          const at::Tensor& q, const BlockOffsets& offsets) const {
  const DFlashModel::Layer& l = model.layers_[layer];
  const double eps = model.shape_.rms_norm_eps;
  const at::Tensor attention = block_attention(q, context.keys[layer], context.values[layer], offsets.cu_q, offsets.cu_k,
                                               offsets.max_keys);
  const at::Tensor y = at::addmm(x, attention, l.o.t());  // out of place: x may be the caller's tensor
  const at::Tensor gate_up = at::linear(kernel_ops::rms_norm(y, l.post_norm, eps), fused_[layer].gate_up);
  return at::addmm(y, kernel_ops::swiglu(gate_up), l.down.t());
}

// DFlashModel's side of the fused path (declared in dflash_model.h).

bool DFlashModel::fused_drafting() const { return drafting_kernels_ && DraftingFastPath::runs(*this); }

DraftingFastPath* DFlashModel::drafting_fast_path() const {
  if (!fused_drafting()) return nullptr;
  if (!drafting_fast_path_) drafting_fast_path_ = std::make_shared<DraftingFastPath>();
  return drafting_fast_path_.get();
}

void DFlashModel::prepare_drafting(DraftContext& context) const {
  if (DraftingFastPath* fused = drafting_fast_path()) fused->prepare(*this, context);
}

void DFlashModel::release_drafting() const { drafting_fast_path_.reset(); }

}  // namespace dflash::drafter
