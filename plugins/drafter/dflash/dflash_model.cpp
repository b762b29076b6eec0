#include "dflash_model.h"

#include "drafting_fast_path.h"
#include "grouped_attention.h"
#include "row_gather.h"

#include <dflash/sdk/torch_compat.hpp>
#include <host_upload.h>
#include <kernel_ops.h>
#include <trainable_ops.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>

#if DFLASH_TORCH_AT_LEAST(2, 5)
#include <ATen/ops/_flash_attention_forward.h>  // drafting's varlen attention
#endif

namespace dflash::drafter {
namespace {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // Hugging Face's arithmetic: normalise in fp32, round, then scale.
  const at::Tensor f = x.to(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  return weight * (f * at::rsqrt(f.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// cos and sin of every position's rotary angles, computed once per step and
// shared by all layers. Op-by-op (decoding, layer_ops aten): [B, L, 1, d] in
// the activations' dtype, rounded from fp64. Fused training: the halves
// [B, L, d/2] in trainable_ops::rotary_dtype.
struct Rotary {
  at::Tensor cos, sin;
};
Rotary rotary_tables(const at::Tensor& positions, int64_t d, double theta, const at::TensorOptions& options) {
  const trainable_ops::RotaryHalves halves = trainable_ops::rotary_halves(positions, d, theta, options.device(), at::kDouble);
  auto full = [&](const at::Tensor& half) { return at::cat({half, half}, -1).unsqueeze(2).to(options.dtype()); };
  return {full(halves.cos), full(halves.sin)};
}
Rotary rotary_half_tables(const at::Tensor& positions, int64_t d, double theta, const at::TensorOptions& options) {
  const trainable_ops::RotaryHalves halves = trainable_ops::rotary_halves(
      positions, d, theta, options.device(), trainable_ops::rotary_dtype(c10::typeMetaToScalarType(options.dtype())));
  return {halves.cos, halves.sin};
}

// x [B, L, heads, d] rotated by its positions' tables.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

}  // namespace

at::Tensor& DFlashModel::add(const std::string& name, at::Tensor value) {
  parameters_.emplace_back(name, std::move(value));
  return parameters_.back().second;
}

DFlashModel::DFlashModel(const DrafterShape& s, uint64_t seed, double init_std, c10::ScalarType dtype, c10::Device device)
    : shape_(s) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  auto normal = [&](std::vector<int64_t> size) {
    at::Tensor t = at::empty(size, at::kFloat);
    t.normal_(0.0, init_std, generator);
    return t.to(device, dtype).set_requires_grad(true);
  };
  auto ones = [&](int64_t n) { return at::ones({n}, at::TensorOptions().dtype(dtype).device(device)).set_requires_grad(true); };
  const int64_t h = s.hidden, q_out = s.heads * s.head_dim, kv_out = s.kv_heads * s.head_dim;
  parameters_.reserve(static_cast<size_t>(3 + 11 * s.layers));
  fc_ = add("fc.weight", normal({h, s.feature_layers * s.target_hidden}));
  hidden_norm_ = add("hidden_norm.weight", ones(h));
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    Layer l;
    l.input_norm = add(p + "input_layernorm.weight", ones(h));
    l.q = add(p + "self_attn.q_proj.weight", normal({q_out, h}));
    l.k = add(p + "self_attn.k_proj.weight", normal({kv_out, h}));
    l.v = add(p + "self_attn.v_proj.weight", normal({kv_out, h}));
    l.o = add(p + "self_attn.o_proj.weight", normal({h, q_out}));
    l.q_norm = add(p + "self_attn.q_norm.weight", ones(s.head_dim));
    l.k_norm = add(p + "self_attn.k_norm.weight", ones(s.head_dim));
    l.post_norm = add(p + "post_attention_layernorm.weight", ones(h));
    l.gate = add(p + "mlp.gate_proj.weight", normal({s.intermediate, h}));
    l.up = add(p + "mlp.up_proj.weight", normal({s.intermediate, h}));
    l.down = add(p + "mlp.down_proj.weight", normal({h, s.intermediate}));
    layers_.push_back(l);
  }
  final_norm_ = add("norm.weight", ones(h));
}

void DFlashModel::init_final_norm(const at::Tensor& target_final_norm) {
  const c10::NoGradGuard no_grad;
  final_norm_.copy_(target_final_norm.to(final_norm_.device(), final_norm_.scalar_type()));
}

namespace {

struct LayerSettings {
  int64_t heads, kv_heads, head_dim;
  double eps;
  // trainable_ops' autograd functions (rotary tables as halves) rather than
  // Hugging Face's op-by-op chain (full tables): DFlashModel::LayerOps.
  bool fused;
};

// The norms outside the layers (context, final), the way the layers run theirs.
at::Tensor norm_of(const LayerSettings& s, const at::Tensor& x, const at::Tensor& weight) {
  return s.fused ? trainable_ops::rms_norm(x, weight, s.eps) : rms_norm(x, weight, s.eps);
}

// How a layer's queries see its keys [context S | block slots Q]:
//   dense   — one SDPA call per batch with the additive mask [B, 1, Q, S + Q];
//   grouped — the attention groups (block_layout's attention_groups, their
//             context ranges widened to kGroupKeyMultiple), batched by shape:
//             one call per distinct (queries, context length), its groups'
//             queries and keys gathered by index. `groups` [shapes,
//             kGroupColumns] (CPU int64) holds each shape's group count,
//             queries per group, context length, offset into `bias` (the
//             shapes' additive masks, one after another, rows padded) and
//             offset into `index` (device int64: first the order that puts
//             the calls' outputs back in query order [B·Q], then per shape its
//             query rows and key rows, flat indices into [B·Q] and
//             [B·(S + Q)]); then, where those rows are at most
//             kMaxRowRanges contiguous runs each, the runs (AttentionCall's
//             query_ranges and key_ranges).
// Either way no tensor of attention scores is materialised per head: the
// kernel (memory-efficient or cuDNN attention on CUDA) streams over the keys.
// The columns of Attention::groups.
enum GroupColumn : int64_t { kGroupCount, kGroupQueries, kGroupContext, kGroupBiasAt, kGroupIndexAt, kQueryRangeCount, kKeyRangeCount, kRanges };
constexpr int64_t kMaxRowRanges = 8;  // more runs than this: by index (one kernel) rather than a slice each
constexpr int64_t kGroupColumns = kRanges + 4 * kMaxRowRanges;  // query runs, then key runs, (start, length) each
constexpr int64_t kQueryRanges = kRanges, kKeyRanges = kRanges + 2 * kMaxRowRanges;

// A shape's runs in its row of the table: their count at count_column, then
// (start, length) pairs from first_column.
void write_runs(at::TensorAccessor<int64_t, 1> row, int64_t count_column, int64_t first_column,
                const std::vector<RowRange>& runs) {
  row[count_column] = static_cast<int64_t>(runs.size());
  for (size_t r = 0; r < runs.size(); ++r) {
    row[first_column + 2 * static_cast<int64_t>(r)] = runs[r].start;
    row[first_column + 2 * static_cast<int64_t>(r) + 1] = runs[r].length;
  }
}
std::vector<RowRange> read_runs(at::TensorAccessor<int64_t, 1> row, int64_t count_column, int64_t first_column) {
  std::vector<RowRange> runs;
  for (int64_t r = 0; r < row[count_column]; ++r) runs.push_back({row[first_column + 2 * r], row[first_column + 2 * r + 1]});
  return runs;
}

struct Attention {
  at::Tensor bias, groups, index;
  bool cudnn = false;  // cuDNN's kernel (cudnn_attention_works) instead of SDPA
  // Grouped: backward keeps the layer's q/k/v rows, not every call's copies
  // (attention_keeping_rows).
  bool keeps_rows = false;
  // Block attention (prefix_block_attention): the prefix calls (CPU int64
  // [n, 4]) and the kernel's entries and key tiles (device), in place of the above.
  at::Tensor prefixes, blocks, tiles;
  bool block_kernel() const { return blocks.defined() && blocks.numel() > 0; }
  bool grouped() const { return groups.defined() && groups.numel() > 0; }
};

// One decoder layer: x [B, Q, H] (the block slots), context [B, S, H] (the
// injected features); w = the layer's 11 weights in the order of
// DFlashModel::Layer; rotary tables for the slots (q) and the keys (k).
at::Tensor layer_forward(const LayerSettings& s, const std::vector<at::Tensor>& w, const at::Tensor& x,
                         const at::Tensor& context, const Attention& plan, const Rotary& rotary_q, const Rotary& rotary_k) {
  const at::Tensor &input_norm = w[0], &wq = w[1], &wk = w[2], &wv = w[3], &wo = w[4], &q_norm = w[5], &k_norm = w[6];
  const at::Tensor &post_norm = w[7], &gate = w[8], &up = w[9], &down = w[10];
  const int64_t b = x.size(0), q_len = x.size(1), ctx_len = context.size(1);
  // The slots' q, k and v from the input norm (fused: h is not kept for
  // backward but recomputed there).
  at::Tensor q_slots, k_slots, v_slots;
  if (s.fused) {
    const trainable_ops::Projections p = trainable_ops::norm_projections(x, input_norm, wq, wk, wv, s.eps);
    q_slots = p.first, k_slots = p.second, v_slots = p.third;
  } else {
    const at::Tensor h = rms_norm(x, input_norm, s.eps);
    q_slots = at::linear(h, wq), k_slots = at::linear(h, wk), v_slots = at::linear(h, wv);
  }
  at::Tensor q = q_slots.view({b, q_len, s.heads, s.head_dim});
  // Keys and values: the context's (injected) and the block slots' own, through the same projections.
  at::Tensor k = at::cat({at::linear(context, wk), k_slots}, 1).view({b, ctx_len + q_len, s.kv_heads, s.head_dim});
  at::Tensor v = at::cat({at::linear(context, wv), v_slots}, 1).view({b, ctx_len + q_len, s.kv_heads, s.head_dim});
  if (s.fused) {
    q = trainable_ops::head_norm_rope(q, q_norm, {rotary_q.cos, rotary_q.sin}, s.eps);  // [B, Q, heads, d]
    k = trainable_ops::head_norm_rope(k, k_norm, {rotary_k.cos, rotary_k.sin}, s.eps);  // [B, S + Q, kv, d]
  } else {
    q = rope(rms_norm(q, q_norm, s.eps), rotary_q.cos, rotary_q.sin);
    k = rope(rms_norm(k, k_norm, s.eps), rotary_k.cos, rotary_k.sin);
  }
  at::Tensor projected;  // the attention's output through o_proj, [B, Q, H]
  if (plan.block_kernel()) {
    const at::Tensor out = prefix_block_attention(q.reshape({b * q_len, s.heads, s.head_dim}),
                                                  k.reshape({b * (ctx_len + q_len), s.kv_heads, s.head_dim}),
                                                  v.reshape({b * (ctx_len + q_len), s.kv_heads, s.head_dim}), plan.prefixes,
                                                  plan.blocks, plan.tiles);  // [B·Q, heads, d], in slot order
    projected = at::linear(out.view({b, q_len, s.heads * s.head_dim}), wo);
  } else if (plan.grouped()) {
    const auto g = plan.groups.accessor<int64_t, 2>();
    const at::Tensor q_rows = q.reshape({b * q_len, s.heads, s.head_dim});
    const at::Tensor k_rows = k.reshape({b * (ctx_len + q_len), s.kv_heads, s.head_dim});
    const at::Tensor v_rows = v.reshape({b * (ctx_len + q_len), s.kv_heads, s.head_dim});
    // Each call's groups, query and key rows (the group's context range, then
    // its own slots) and mask.
    std::vector<AttentionCall> calls;
    for (int64_t i = 0; i < g.size(0); ++i) {
      AttentionCall c;
      c.count = g[i][kGroupCount], c.queries = g[i][kGroupQueries], c.keys = g[i][kGroupContext] + c.queries;
      const int64_t bias_at = g[i][kGroupBiasAt], index_at = g[i][kGroupIndexAt];
      c.query_ranges = read_runs(g[i], kQueryRangeCount, kQueryRanges);
      c.key_ranges = read_runs(g[i], kKeyRangeCount, kKeyRanges);
      c.query_index = plan.index.narrow(0, index_at, c.count * c.queries);
      c.key_index = plan.index.narrow(0, index_at + c.count * c.queries, c.count * c.keys);
      const int64_t stride = (c.keys + 15) / 16 * 16;  // additive_mask's padded rows
      c.bias = plan.bias.narrow(0, bias_at, c.count * c.queries * stride)
                   .view({c.count, 1, c.queries, stride})
                   .narrow(3, 0, c.keys);
      calls.push_back(std::move(c));
    }
    const std::vector<at::Tensor> outs =  // each call's [n, heads, queries, d]
        plan.keeps_rows ? attention_keeping_rows(q_rows, k_rows, v_rows, calls, s.heads, s.kv_heads, plan.cudnn)
                        : attention_keeping_calls(q_rows, k_rows, v_rows, calls, s.heads, s.kv_heads, plan.cudnn);
    std::vector<at::Tensor> parts;
    parts.reserve(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      const at::Tensor& out = outs[i];
      const int64_t count = calls[i].count, queries = calls[i].queries;
      // o_proj per call, on the kernel's output as it is laid out ([n,
      // queries, heads·d] is a view of cuDNN's): autograd keeps that one
      // tensor for both backwards, where projecting the reordered concatenation
      // kept a second copy of every output.
      parts.push_back(at::linear(out.transpose(1, 2).reshape({count * queries, s.heads * s.head_dim}), wo));
    }
    // Back to the slots' order: a permutation of the concatenated rows.
    projected = gather_rows(at::cat(parts), {plan.index.narrow(0, 0, b * q_len)}, /*disjoint=*/true)[0].view(
        {b, q_len, x.size(-1)});
  } else {
    projected = at::linear(attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), plan.bias, s.heads, s.kv_heads,
                                  plan.cudnn)
                               .transpose(1, 2)
                               .reshape({b, q_len, s.heads * s.head_dim}),
                           wo);
  }
  const at::Tensor y = x + projected;
  if (s.fused) return trainable_ops::mlp_block(y, post_norm, gate, up, down, s.eps);
  const at::Tensor m = rms_norm(y, post_norm, s.eps);
  return y + at::linear(at::silu(at::linear(m, gate)) * at::linear(m, up), down);
}

// A layer whose activations are not kept: forward saves only its inputs, and
// backward runs the layer again with grad to get the gradients. Costs one more
// forward of the layer; keeps one layer's activations alive instead of all.
class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor x, at::Tensor context,
                                                at::Tensor bias, at::Tensor groups, at::Tensor index, at::Tensor prefixes,
                                                at::Tensor blocks, at::Tensor tiles, at::Tensor cos_q,
                                                at::Tensor sin_q,
                                                at::Tensor cos_k, at::Tensor sin_k, at::Tensor w0, at::Tensor w1,
                                                at::Tensor w2, at::Tensor w3, at::Tensor w4, at::Tensor w5, at::Tensor w6,
                                                at::Tensor w7, at::Tensor w8, at::Tensor w9, at::Tensor w10, int64_t heads,
                                                int64_t kv_heads, int64_t head_dim, double eps, bool cudnn, bool fused,
                                                bool keeps_rows) {
    ctx->save_for_backward({x, context, bias, groups, index, prefixes, blocks, tiles, cos_q, sin_q, cos_k, sin_k, w0, w1, w2,
                            w3, w4, w5, w6, w7, w8, w9, w10});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["head_dim"] = head_dim;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["cudnn"] = cudnn;
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["keeps_rows"] = keeps_rows;
    const LayerSettings s{heads, kv_heads, head_dim, eps, fused};
    return {layer_forward(s, {w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10}, x, context,
                          {bias, groups, index, cudnn, keeps_rows, prefixes, blocks, tiles}, {cos_q, sin_q}, {cos_k, sin_k})};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    const LayerSettings s{ctx->saved_data["heads"].toInt(), ctx->saved_data["kv_heads"].toInt(),
                          ctx->saved_data["head_dim"].toInt(), ctx->saved_data["eps"].toDouble(),
                          ctx->saved_data["fused"].toBool()};
    const c10::AutoGradMode enable(true);
    // Fresh leaves for every differentiable input; the gradients returned
    // here are what autograd accumulates into the real ones.
    std::vector<at::Tensor> leaves, weights;
    auto leaf = [&](const at::Tensor& t) {
      at::Tensor l = t.detach().requires_grad_(t.is_floating_point());
      leaves.push_back(l);
      return l;
    };
    const at::Tensor x = leaf(saved[0]), context = leaf(saved[1]);
    for (size_t i = 12; i < 23; ++i) weights.push_back(leaf(saved[i]));
    const Attention plan{saved[2],  saved[3],  saved[4], ctx->saved_data["cudnn"].toBool(),
                         ctx->saved_data["keeps_rows"].toBool(), saved[5], saved[6], saved[7]};
    const at::Tensor y = layer_forward(s, weights, x, context, plan, {saved[8], saved[9]}, {saved[10], saved[11]});
    const auto grads = torch::autograd::grad({y}, leaves, {grad_output[0]}, /*retain_graph=*/false,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    // x, context; then none for the plan's six tensors and the four rotary tables.
    torch::autograd::variable_list out = {grads[0], grads[1]};
    for (int i = 0; i < 10; ++i) out.emplace_back();
    for (size_t i = 2; i < grads.size(); ++i) out.push_back(grads[i]);
    for (int i = 0; i < 7; ++i) out.emplace_back();  // heads, kv_heads, head_dim, eps, cudnn, fused, keeps_rows
    return out;
  }
};

// Appends rows [start, start + length) to runs in index order, joining a run
// that continues the last one.
void add_row_range(std::vector<RowRange>& ranges, int64_t start, int64_t length) {
  if (length == 0) return;
  if (!ranges.empty() && ranges.back().start + ranges.back().length == start)
    ranges.back().length += length;
  else
    ranges.push_back({start, length});
}

// The additive masks (0 where a query may attend, −inf elsewhere) for the
// chosen form, built on the device once per step for every layer.
Attention attention_plan(const BlockMasks& masks, const at::TensorOptions& options) {
  Attention plan;
  const std::vector<AttentionGroup> groups =
      masks.group_blocks > 0 ? attention_groups(masks.anchors, masks.documents, masks.group_blocks, masks.group_key_multiple)
                             : std::vector<AttentionGroup>{};
  if (groups.empty()) {
    plan.bias = additive_mask(block_attention_mask(masks.anchors, masks.documents, masks.block_size), options).unsqueeze(1);
    plan.groups = at::empty({0, kGroupColumns}, at::kLong);
    plan.index = at::empty({0}, at::kLong);
    return plan;
  }
  const int64_t bs = masks.block_size, rows = masks.documents.size(0), context = masks.documents.size(1);
  const int64_t queries_per_row = masks.anchors.size(1) * bs, keys_per_row = context + queries_per_row;
  // Groups by shape, in a fixed order (the shapes', then the groups').
  std::map<std::pair<int64_t, int64_t>, std::vector<const AttentionGroup*>> shapes;
  for (const AttentionGroup& g : groups) shapes[{g.queries(bs), g.context_end - g.context_begin}].push_back(&g);

  // Uploads that do not wait for the device (host_upload.h).
  const at::Tensor anchors = decode_support::on_device(masks.anchors.to(at::kLong), options.device());
  const at::Tensor documents = decode_support::on_device(masks.documents.to(at::kLong), options.device());
  plan.groups = at::zeros({static_cast<int64_t>(shapes.size()), kGroupColumns}, at::kLong);
  auto table = plan.groups.accessor<int64_t, 2>();
  std::vector<int64_t> index(static_cast<size_t>(rows * queries_per_row), -1);  // the order first
  std::vector<at::Tensor> padded_masks;
  int64_t shape = 0, bias_at = 0, output_row = 0;
  for (const auto& [dims, members] : shapes) {
    const auto [queries, length] = dims;
    const auto count = static_cast<int64_t>(members.size());
    table[shape][kGroupCount] = count;
    table[shape][kGroupQueries] = queries;
    table[shape][kGroupContext] = length;
    table[shape][kGroupBiasAt] = bias_at;
    table[shape][kGroupIndexAt] = static_cast<int64_t>(index.size());
    std::vector<AttentionGroup> of_shape;
    std::vector<RowRange> query_ranges, key_ranges;
    for (const AttentionGroup* g : members) {
      const int64_t first_query = g->row * queries_per_row + g->first_block * bs;
      for (int64_t j = 0; j < queries; ++j) {
        index.push_back(first_query + j);
        index[static_cast<size_t>(first_query + j)] = output_row++;  // where this query's output lands
      }
      add_row_range(query_ranges, first_query, queries);
      of_shape.push_back(*g);
    }
    for (const AttentionGroup* g : members) {
      const int64_t row_keys = g->row * keys_per_row;
      for (int64_t c = g->context_begin; c < g->context_end; ++c) index.push_back(row_keys + c);
      for (int64_t j = 0; j < queries; ++j) index.push_back(row_keys + context + g->first_block * bs + j);
      add_row_range(key_ranges, row_keys + g->context_begin, g->context_end - g->context_begin);
      add_row_range(key_ranges, row_keys + context + g->first_block * bs, queries);
    }
    if (static_cast<int64_t>(std::max(query_ranges.size(), key_ranges.size())) <= kMaxRowRanges) {
      write_runs(table[shape], kQueryRangeCount, kQueryRanges, query_ranges);
      write_runs(table[shape], kKeyRangeCount, kKeyRanges, key_ranges);
    }
    const at::Tensor bias =  // [n, queries, keys], rows padded
        additive_mask(stacked_group_attention_masks(of_shape, anchors, documents, bs), options);
    padded_masks.push_back(bias.as_strided({bias.size(0) * bias.stride(0)}, {1}));
    bias_at += padded_masks.back().numel();
    ++shape;
  }
  if (output_row != rows * queries_per_row) throw std::logic_error("attention_plan: the groups do not cover every query once");
  plan.bias = at::cat(padded_masks);
  plan.index = decode_support::upload(index, options.device());
  return plan;
}

// The block kernel's plan (block_kernel_layout), uploaded once per step for
// every layer without waiting for the device.
Attention block_kernel_plan(const BlockMasks& masks, const c10::Device& device) {
  const BlockKernelTables tables = block_kernel_tables(
      block_kernel_layout(masks.anchors, masks.documents, masks.block_size, masks.group_blocks, masks.group_key_multiple),
      device);
  Attention plan;
  plan.prefixes = tables.prefixes, plan.blocks = tables.blocks, plan.tiles = tables.tiles;
  plan.cudnn = plan.keeps_rows = true;  // what it runs and keeps: cuDNN for the prefixes, the rows
  return plan;
}

}  // namespace

at::Tensor DFlashModel::forward(const at::Tensor& features, const at::Tensor& context_positions,
                                const at::Tensor& slot_embeddings, const at::Tensor& slot_positions,
                                const BlockMasks& masks) const {
  const DrafterShape& s = shape_;
  const double eps = s.rms_norm_eps;
  const LayerSettings settings{s.heads, s.kv_heads, s.head_dim, eps, layer_ops_ == LayerOps::kFused};
  // The context, once: fc + RMSNorm over the concatenated target features.
  const at::Tensor context = norm_of(settings, at::linear(features.to(fc_.scalar_type()), fc_), hidden_norm_);  // [B, S, H]
  const at::Tensor key_positions = at::cat({context_positions, slot_positions}, 1);
  const auto options = slot_embeddings.options();
  const bool cudnn = attention_kernel_ == AttentionKernel::kAuto && options.device().is_cuda() &&
                     (options.dtype() == at::kBFloat16 || options.dtype() == at::kHalf) &&
                     cudnn_attention_works(options, s.heads, s.kv_heads, s.head_dim);
  Attention plan;
  // Block attention: on the GPU where its kernels take the step, on the CPU
  // by its ATen reference (exact, slow: the tests' path); grouped elsewhere.
  const bool block_shape = masks.block_kernel && takes_block_layout(masks.group_blocks, masks.block_size, s.heads, s.kv_heads);
  if (block_shape &&
      (options.device().is_cpu() ||
       (cudnn && kernel_ops::block_attention_fits(slot_embeddings, s.heads, s.kv_heads, s.head_dim, masks.block_size) &&
        cudnn_attention_backward_by_hand_works(options, s.heads, s.kv_heads, s.head_dim)))) {
    plan = block_kernel_plan(masks, options.device());
  } else {
    plan = attention_plan(masks, options);
    plan.cudnn = cudnn;
    // Keeping rows needs cuDNN's backward called by hand to agree (off cuDNN,
    // backward runs each call again under autograd).
    plan.keeps_rows = keeps_rows(attention_keeps_, plan.cudnn) && plan.grouped() &&
                      (!plan.cudnn || cudnn_attention_backward_by_hand_works(options, s.heads, s.kv_heads, s.head_dim));
  }
  // The plan's unused tensors as empty ones: an autograd function's inputs
  // (CheckpointedLayer's) must all be defined.
  for (at::Tensor* t : {&plan.bias, &plan.groups, &plan.index, &plan.prefixes, &plan.blocks, &plan.tiles})
    if (!t->defined()) *t = at::empty({0}, at::kLong);
  const auto tables = settings.fused ? rotary_half_tables : rotary_tables;
  const Rotary rotary_q = tables(slot_positions, s.head_dim, s.rope_theta, options);
  const Rotary rotary_k = tables(key_positions, s.head_dim, s.rope_theta, options);
  at::Tensor x = slot_embeddings;
  for (const Layer& l : layers_) {
    if (activation_checkpointing_ && c10::GradMode::is_enabled()) {
      x = CheckpointedLayer::apply(x, context, plan.bias, plan.groups, plan.index, plan.prefixes, plan.blocks, plan.tiles,
                                   rotary_q.cos, rotary_q.sin, rotary_k.cos,
                                   rotary_k.sin, l.input_norm, l.q, l.k, l.v, l.o, l.q_norm, l.k_norm, l.post_norm, l.gate,
                                   l.up, l.down, s.heads, s.kv_heads, s.head_dim, eps, plan.cudnn, settings.fused,
                                   plan.keeps_rows)[0];
    } else {
      x = layer_forward(settings, {l.input_norm, l.q, l.k, l.v, l.o, l.q_norm, l.k_norm, l.post_norm, l.gate, l.up, l.down},
                        x, context, plan, rotary_q, rotary_k);
    }
  }
  return norm_of(settings, x, final_norm_);
}

namespace {
// Distinct for every buffer allocation of every context.
std::atomic<uint64_t> next_generation{1};
}  // namespace

void DFlashModel::reserve(DraftContext& ctx, int64_t positions) const {
  if (positions <= ctx.capacity && !ctx.keys.empty()) return;
  const DrafterShape& s = shape_;
  const int64_t capacity = std::max<int64_t>({positions, 2 * ctx.capacity, 256});
  const auto options = fc_.options();
  ctx.keys.resize(layers_.size());
  ctx.values.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i)
    for (auto* buffers : {&ctx.keys, &ctx.values}) {
      // Zeros: no row is read before it is written, but stale NaN patterns never reach an attention either way.
      at::Tensor grown = at::zeros({capacity, s.kv_heads, s.head_dim}, options);
      if (ctx.length > 0) grown.narrow(0, 0, ctx.length).copy_((*buffers)[i].narrow(0, 0, ctx.length));
      (*buffers)[i] = grown;
    }
  ctx.capacity = capacity;
  ctx.generation = next_generation++;
}

void DFlashModel::write_context(DraftContext& ctx, const at::Tensor& features, const at::Tensor& positions) const {
  if (DraftingFastPath* fused = drafting_fast_path())  // the GPU's fused kernels (drafting_fast_path.h)
    return fused->write_context(*this, ctx, features, positions);
  const c10::NoGradGuard no_grad;
  const DrafterShape& s = shape_;
  const int64_t n = features.size(0);
  const auto options = fc_.options();
  const at::Tensor context = rms_norm(at::linear(features.to(fc_.device(), fc_.scalar_type()), fc_), hidden_norm_, s.rms_norm_eps);
  const Rotary rotary = rotary_tables(positions.unsqueeze(0), s.head_dim, s.rope_theta, options);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    const at::Tensor k = rope(rms_norm(at::linear(context, l.k).view({1, n, s.kv_heads, s.head_dim}), l.k_norm, s.rms_norm_eps),
                              rotary.cos, rotary.sin)[0];
    const at::Tensor v = at::linear(context, l.v).view({n, s.kv_heads, s.head_dim});
    ctx.keys[i].index_copy_(0, positions, k);
    ctx.values[i].index_copy_(0, positions, v);
  }
}

void DFlashModel::extend_context(DraftContext& ctx, const at::Tensor& features) const {
  const int64_t n = features.size(0);
  reserve(ctx, ctx.length + n);
  write_context(ctx, features, at::arange(ctx.length, ctx.length + n, fc_.options().dtype(at::kLong)));
  ctx.length += n;
}

void DFlashModel::extend_context_at(DraftContext& ctx, const at::Tensor& features, const at::Tensor& base) const {
  write_context(ctx, features, base + at::arange(features.size(0), base.options()));
}

bool DFlashModel::flash_drafting() const {
#if DFLASH_TORCH_AT_LEAST(2, 5)
  const auto options = fc_.options();
  return options.device().is_cuda() && (fc_.scalar_type() == at::kBFloat16 || fc_.scalar_type() == at::kHalf) &&
         shape_.head_dim % 8 == 0 && shape_.head_dim <= 256;
#else
  return false;
#endif
}

at::Tensor DFlashModel::run_block(DraftContext& ctx, const at::Tensor& slot_embeddings, const at::Tensor& positions,
                                  int64_t host_keys, const at::Tensor& base) const {
  if (DraftingFastPath* fused = drafting_fast_path())  // the GPU's fused kernels (drafting_fast_path.h)
    return fused->run_block(*this, ctx, slot_embeddings, positions, host_keys, base);
  const c10::NoGradGuard no_grad;
  const DrafterShape& s = shape_;
  const double eps = s.rms_norm_eps;
  const int64_t slots = slot_embeddings.size(0);
  const auto options = fc_.options();
  const Rotary rotary = rotary_tables(positions.unsqueeze(0), s.head_dim, s.rope_theta, options);
  at::Tensor cu_q, cu_k;  // flash: the block's queries, and the keys [0, base + Bs)
  if (host_keys == 0) {
    cu_q = at::arange(0, 2 * slots, slots, base.options()).to(at::kInt);  // [0, Bs], made on the device
    cu_k = at::cat({at::zeros({1}, base.options()), base + slots}).to(at::kInt);
  }
  at::Tensor x = slot_embeddings.to(fc_.device(), fc_.scalar_type()).unsqueeze(0);  // [1, Bs, H]
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    const at::Tensor h = rms_norm(x, l.input_norm, eps);
    const at::Tensor q = rope(rms_norm(at::linear(h, l.q).view({1, slots, s.heads, s.head_dim}), l.q_norm, eps), rotary.cos, rotary.sin);
    const at::Tensor k = rope(rms_norm(at::linear(h, l.k).view({1, slots, s.kv_heads, s.head_dim}), l.k_norm, eps), rotary.cos, rotary.sin);
    const at::Tensor v = at::linear(h, l.v).view({1, slots, s.kv_heads, s.head_dim});
    // Keys: the accepted context (cached), then the block's own slots, written right after it.
    ctx.keys[i].index_copy_(0, positions, k[0]);
    ctx.values[i].index_copy_(0, positions, v[0]);
    at::Tensor attention;
    if (host_keys > 0) {
      const at::Tensor keys = ctx.keys[i].narrow(0, 0, host_keys), values = ctx.values[i].narrow(0, 0, host_keys);
      attention = attend(q.transpose(1, 2), keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0), at::Tensor(),
                         s.heads, s.kv_heads, /*cudnn=*/false)
                      .transpose(1, 2)
                      .reshape({1, slots, s.heads * s.head_dim});
    } else {
#if DFLASH_TORCH_AT_LEAST(2, 5)
      // Every slot sees every key (no mask): not causal.
      auto result = at::_flash_attention_forward(q[0].contiguous(), ctx.keys[i], ctx.values[i], cu_q, cu_k, slots, ctx.capacity,
                                                 /*dropout_p=*/0.0, /*is_causal=*/false, /*return_debug_mask=*/false,
                                                 1.0 / std::sqrt(static_cast<double>(s.head_dim)));
      attention = std::get<0>(result).reshape({1, slots, s.heads * s.head_dim});
#else
      throw std::logic_error("dflash: flash drafting needs LibTorch >= 2.5");
#endif
    }
    const at::Tensor y = x + at::linear(attention, l.o);
    const at::Tensor m = rms_norm(y, l.post_norm, eps);
    x = y + at::linear(at::silu(at::linear(m, l.gate)) * at::linear(m, l.up), l.down);
  }
  return rms_norm(x, final_norm_, eps)[0];
}

at::Tensor DFlashModel::draft(DraftContext& ctx, const at::Tensor& slot_embeddings) const {
  const int64_t slots = slot_embeddings.size(0);
  reserve(ctx, ctx.length + slots);
  const at::Tensor positions = at::arange(ctx.length, ctx.length + slots, fc_.options().dtype(at::kLong));
  return run_block(ctx, slot_embeddings, positions, ctx.length + slots, at::Tensor());
}

at::Tensor DFlashModel::draft_at(DraftContext& ctx, const at::Tensor& slot_embeddings, const at::Tensor& base) const {
  const at::Tensor positions = base + at::arange(slot_embeddings.size(0), base.options());
  return run_block(ctx, slot_embeddings, positions, 0, base);
}

std::vector<int64_t> extend_and_draft_positions(int64_t length, int64_t accepted, int64_t rows, int64_t slots) {
  std::vector<int64_t> values;
  values.reserve(static_cast<size_t>(rows + slots + 3));
  for (int64_t j = 0; j < rows; ++j) values.push_back(length + j + (j < accepted ? 0 : slots));
  for (int64_t i = 0; i < slots; ++i) values.push_back(length + accepted + i);
  values.push_back(length + accepted);
  values.push_back(0);
  values.push_back(length + accepted + slots);
  return values;
}

ExtendAndDraftPositions extend_and_draft_views(const at::Tensor& values, int64_t rows, int64_t slots) {
  ExtendAndDraftPositions p;
  p.all = values.narrow(0, 0, rows + slots);
  p.context = p.all.narrow(0, 0, rows);
  p.block = p.all.narrow(0, rows, slots);
  p.block_base = values.narrow(0, rows + slots, 1);
  p.key_range = values.narrow(0, rows + slots + 1, 2);
  return p;
}

at::Tensor DFlashModel::extend_and_draft_at(DraftContext& ctx, const at::Tensor& features, const at::Tensor& slot_embeddings,
                                            const ExtendAndDraftPositions& where) const {
  if (DraftingFastPath* fused = drafting_fast_path())  // one pass (drafting_fast_path.h)
    return fused->extend_and_run_block(*this, ctx, features, slot_embeddings, where);
  write_context(ctx, features, where.context);
  return run_block(ctx, slot_embeddings, where.block, 0, where.block_base);
}

}  // namespace dflash::drafter
