// dflash/sdk/chunked_loss.hpp — memory-bounded losses over the lm_head's
// logits. The author writes one chunk's mathematics; the toolkit does the
// rest, so no [tokens × vocab] tensor ever outlives its chunk:
//
//   class ReverseKl : public dflash::sdk::ChunkedLoss<ReverseKl> {
//    public:
//     static constexpr dflash::sdk::PluginInfo info{"reverse_kl", "1.0.0", "KL(student ‖ teacher)"};
//     static std::string config_schema() { return dflash::sdk::chunked_loss_schema().dump(); }
//     explicit ReverseKl(const dflash::sdk::CreateContext& context)
//         : ChunkedLoss(context, dflash::sdk::Teacher::kHidden) {}
//     dflash::sdk::ChunkRows rows(const dflash::sdk::LossChunk& c) const {
//       const at::Tensor log_q = c.logits.log_softmax(1), log_p = c.teacher_logits.log_softmax(1);
//       return {(log_q.exp() * (log_q - log_p)).sum(1)};
//     }
//   };
//   DFLASH_PLUGINS(ReverseKl)
//
// The author's methods (one of the first two is required):
//   ChunkRows rows(const LossChunk&) const           per-row losses ℓ_i of the
//       chunk's rows (and optional per-row metrics). Differentiated by
//       autograd, one chunk at a time.
//   ChunkRows rows_and_grad(const LossChunk&) const  (optional, the fast path)
//       the same, plus the gradient in closed form: ChunkRows::grad =
//       ∂(Σ_i c_i·ℓ_i)/∂z, [rows, V], with c_i = LossChunk::coefficient. When
//       present it is used instead of rows(), and no autograd graph is built.
//   bool logits_in_input_dtype(const at::Tensor& hidden) const  (optional)
//       true: LossChunk::logits stay in the input dtype (bf16: half the
//       bytes) instead of the math dtype. For kernels that accumulate in fp32.
//   double logit_bytes(const LossShape&) const  (optional)
//       bytes alive per element of a [chunk, V] logit tensor while a chunk
//       runs (all its buffers together); sizes the chunk and the estimate.
//   static constexpr bool reports_correct = true;  (optional)
//       ChunkRows::correct is filled (the top-1 hit, argmax z == target), so
//       the toolkit does not read the logits once more to find it.
//
// What the toolkit does: checks the inputs (check_loss_inputs); forms the
// logits z = h·Wᵀ (and the teacher's u = h_t·Wᵀ, without gradient) chunk by
// chunk; hands each chunk to the author; reduces Σ_i c_i·ℓ_i with
// c_i = w_i / Σ_valid w (reduction "mean") or w_i ("sum"), w_i the row weight
// and 0 on ignored rows (all rows ignored: loss 0, no NaN); differentiates
// each chunk inside the loop, while its logits exist, and keeps only dL/dh
// [N, H] (and dL/dW [V, H] in the math dtype when the lm_head trains) for the
// backward; reports per-row "accuracy" (argmax z == target, 0 on ignored
// rows: one definition for every loss), the author's per-row metrics (0 on
// ignored rows) and "chunk_rows"; sizes the chunk from the settings of
// chunked_loss_schema() and answers the memory planner (estimate_memory,
// with chunk_size as its memory knob). Any device, any float dtype: the
// GEMMs run in the input dtype, the softmax arithmetic in loss_math_dtype().
#pragma once

#include <dflash/sdk/loss.hpp>
#include <dflash/sdk/loss_checks.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <functional>
#include <string>

namespace dflash::sdk {

// One chunk of rows, as the author's mathematics sees it. The logits are the
// chunk's own buffer: a fast path may write its gradient over them.
struct LossChunk {
  at::Tensor logits;          // [r, V] z = h·Wᵀ, math dtype (see logits_in_input_dtype)
  at::Tensor teacher_logits;  // [r, V] u = h_t·Wᵀ, no gradient (Teacher::kHidden), z's dtype
  at::Tensor teacher_topk_ids, teacher_topk_logprobs;  // [r, K] (Teacher::kTopK)
  at::Tensor targets;         // [r] int64; ignored rows hold 0, a valid id
  at::Tensor valid;           // [r] bool: false on rows whose target is the ignore index
  at::Tensor row_weights;     // [r] math dtype; ones when the batch has none
  at::Tensor coefficient;     // [r] math dtype: c_i, the row's weight in the reduced loss
  int64_t first_row = 0;      // of the chunk, in the batch
  bool need_grad = false;     // rows_and_grad only: whether to return grad
};

// What the author returns for a chunk.
struct ChunkRows {
  at::Tensor loss;     // [r] ℓ_i, one per row (required); ignored rows are masked by the toolkit
  TensorDict metrics;  // [r] per-row metrics (optional), reported per row, 0 on ignored rows
  at::Tensor grad;     // rows_and_grad: [r, V] ∂(Σ c_i·ℓ_i)/∂z (may be chunk.logits, overwritten)
  at::Tensor correct;  // [r] bool top-1 hit (optional; see reports_correct)
};

// The settings every chunked loss has, with their one set of defaults.
// Start a chunked loss's schema from it and add the loss's own settings.
inline Schema chunked_loss_schema() {
  Schema schema;
  schema.string("reduction", "mean", "mean: Σ w·ℓ / Σ w over supervised rows; sum: Σ w·ℓ", {"mean", "sum"})
      .integer("chunk_size", 0, "rows per chunk; 0 = as many as chunk_memory_mb allows (at most 2048)",
               Bounds::between(0, 1LL << 32))
      .memory_knob("chunk size")
      .number("chunk_memory_mb", 4096, "workspace budget of one chunk when chunk_size is 0", Bounds::above(0).up_to(1 << 30));
  return schema;
}

struct ChunkedLossSettings {
  bool mean;
  int64_t chunk_size;
  double chunk_memory_mb;

  static ChunkedLossSettings read(const nlohmann::json& config) {
    for (const char* key : {"reduction", "chunk_size", "chunk_memory_mb"})
      if (!config.contains(key))
        throw Error(DFLASH_ERR_INVALID_CONFIG, std::string("the config has no '") + key +
                                                   "': a chunked loss's config_schema() must start from "
                                                   "dflash::sdk::chunked_loss_schema()");
    return {config.at("reduction").get<std::string>() == "mean", config.at("chunk_size").get<int64_t>(),
            config.at("chunk_memory_mb").get<double>()};
  }
};

namespace detail {

// An automatic chunk never exceeds this many rows: the GEMMs of a chunk are
// near their peak by M = 2048 (3 GEMMs at V 248,320 on an H200: 1.077 × the
// monolithic GEMM at 512 rows, 1.050 at 1024, 1.036 at 2048; the drafter's
// step at context 8192 3.3 ms shorter at 2048 than at 1024, its step peak
// unchanged; docs/performance.md), while memory keeps growing with the chunk.
constexpr int64_t kAutoChunkRowsCap = 2048;

// Rows per chunk: the setting, or as many as the workspace budget allows.
inline int64_t chunk_rows_for(const ChunkedLossSettings& s, int64_t rows, int64_t vocab, double logit_bytes) {
  int64_t chunk = s.chunk_size;
  if (chunk <= 0) {
    const double budget = s.chunk_memory_mb * 1024.0 * 1024.0;
    chunk = std::min(kAutoChunkRowsCap, static_cast<int64_t>(budget / (static_cast<double>(vocab) * logit_bytes)));
    if (chunk >= 128) chunk -= chunk % 128;  // whole tiles for the GEMMs
  }
  return std::clamp<int64_t>(chunk, 1, std::max<int64_t>(rows, 1));
}

// Everything one call of the chunk loop needs besides the differentiable
// inputs, and what it hands back. Type-erased so the autograd function below
// is one class for every loss.
struct ChunkRun {
  const char* plugin = "";
  std::function<ChunkRows(LossChunk&)> math;
  bool closed_form = false, reports_correct = false, logits_in_input_dtype = false, need_grad = false;
  Teacher teacher = Teacher::kNone;
  int64_t chunk = 1;
  at::Tensor targets, valid, row_weights, coefficient, topk_ids, topk_logprobs;  // [N] / [N, K]
  // [H_t, V]: the teacher's own head, transposed (ABI 1.6); undefined: the student's.
  at::Tensor teacher_weight_t;
  // Filled by the loop: per-row top-1 hits and the author's per-row metrics.
  at::Tensor correct;
  TensorDict metrics;
};

[[noreturn]] inline void bad_chunk_output(const ChunkRun& run, const std::string& what) {
  throw Error(DFLASH_ERR_INTERNAL, std::string(run.closed_form ? "rows_and_grad()" : "rows()") + " " + what);
}

inline void check_rows(const ChunkRun& run, const ChunkRows& out, int64_t rows, int64_t vocab, bool want_grad) {
  if (!out.loss.defined() || out.loss.dim() != 1 || out.loss.size(0) != rows || !at::isFloatingType(out.loss.scalar_type()))
    bad_chunk_output(run, "returned a loss of shape " + shape_text(out.loss) + "; it must be a floating [" +
                              std::to_string(rows) + "]: one ℓ per row of the chunk, not reduced");
  if (want_grad && (!out.grad.defined() || !out.grad.sizes().equals({rows, vocab})))
    bad_chunk_output(run, "returned a gradient of shape " + shape_text(out.grad) + "; with need_grad it must be [" +
                              std::to_string(rows) + ", " + std::to_string(vocab) + "] = ∂(Σ c·ℓ)/∂z");
  if (run.reports_correct && (!out.correct.defined() || out.correct.numel() != rows))
    bad_chunk_output(run, "declares reports_correct but returned correct of shape " + shape_text(out.correct));
  for (const auto& [name, t] : out.metrics)
    if (!t.defined() || t.dim() != 1 || t.size(0) != rows)
      bad_chunk_output(run, "returned metric '" + name + "' of shape " + shape_text(t) + "; metrics must be [" +
                                std::to_string(rows) + "], one value per row");
}

// The chunk of rows [start, start + rows) with its logits formed.
inline LossChunk make_chunk(const ChunkRun& run, const at::Tensor& hidden, const at::Tensor& weight_t,
                            const at::Tensor& teacher_hidden, int64_t start, int64_t rows, bool need_grad) {
  const at::ScalarType logit_dtype =
      run.logits_in_input_dtype ? hidden.scalar_type() : loss_math_dtype(hidden.scalar_type());
  LossChunk c;
  const at::Tensor h = hidden.narrow(0, start, rows);
  const bool shared_weight = !run.teacher_weight_t.defined();
  if (run.teacher == Teacher::kHidden && run.closed_form && shared_weight &&
      teacher_hidden.scalar_type() == hidden.scalar_type()) {
    // Student and teacher rows through one GEMM of twice the rows: a taller
    // GEMM runs nearer the monolithic one's rate (3 GEMMs in 2048-row chunks
    // 1.045 × the floor, in 1024-row chunks 1.057 ×; docs/performance.md),
    // and z and u are the two halves of its output. Closed forms only: an
    // autograd author's z stays a buffer of its own.
    const c10::NoGradGuard frozen_teacher;
    const at::Tensor both = at::matmul(at::cat({h, teacher_hidden.narrow(0, start, rows)}), weight_t).to(logit_dtype);
    c.logits = both.narrow(0, 0, rows);
    c.teacher_logits = both.narrow(0, rows, rows);
  } else {
    c.logits = at::matmul(h, weight_t).to(logit_dtype).contiguous();
    if (run.teacher == Teacher::kHidden) {
      const c10::NoGradGuard frozen_teacher;
      c.teacher_logits = at::matmul(teacher_hidden.narrow(0, start, rows), shared_weight ? weight_t : run.teacher_weight_t)
                             .to(logit_dtype)
                             .contiguous();
    }
  }
  if (run.teacher == Teacher::kTopK) {
    c.teacher_topk_ids = run.topk_ids.narrow(0, start, rows);
    c.teacher_topk_logprobs = run.topk_logprobs.narrow(0, start, rows);
  }
  c.targets = run.targets.narrow(0, start, rows);
  c.valid = run.valid.narrow(0, start, rows);
  c.row_weights = run.row_weights.narrow(0, start, rows);
  c.coefficient = run.coefficient.narrow(0, start, rows);
  c.first_row = start;
  c.need_grad = need_grad;
  return c;
}

// Runs the author's mathematics on one chunk. Returns its rows, with grad
// set to ∂(Σ c·ℓ)/∂z when a gradient is wanted (by autograd on this chunk's
// graph alone, or by the closed form).
inline ChunkRows run_chunk(ChunkRun& run, LossChunk& c) {
  const int64_t rows = c.logits.size(0), vocab = c.logits.size(1);
  if (run.closed_form || !c.need_grad) {
    ChunkRows out = run.math(c);
    check_rows(run, out, rows, vocab, run.closed_form && c.need_grad);
    return out;
  }
  const at::Tensor z = c.logits.requires_grad_(true);
  const at::AutoGradMode chunk_graph(true);
  ChunkRows out = run.math(c);
  check_rows(run, out, rows, vocab, false);
  if (!out.loss.requires_grad())
    bad_chunk_output(run, "returned a loss that does not depend on the logits (no autograd graph to the chunk's z)");
  const at::Tensor masked = at::where(c.valid, out.loss.to(c.coefficient.scalar_type()), at::zeros_like(c.coefficient));
  out.grad = torch::autograd::grad({(c.coefficient * masked).sum()}, {z})[0];
  out.loss = out.loss.detach();
  return out;
}

// Copies a chunk's per-row outputs into the [N] buffers of the run.
inline void keep_row_outputs(ChunkRun& run, const ChunkRows& out, const LossChunk& c, int64_t n) {
  const int64_t rows = c.targets.size(0);
  if (out.correct.defined()) run.correct.narrow(0, c.first_row, rows).copy_(out.correct);
  for (const auto& [name, t] : out.metrics) {
    at::Tensor all = run.metrics.get(name);
    if (!all.defined()) {
      all = at::zeros({n}, c.coefficient.options());
      run.metrics.set(name, all);
    }
    all.narrow(0, c.first_row, rows).copy_(t.detach());
  }
}

// Σ c·ℓ over every chunk, differentiated chunk by chunk during forward:
// only dL/dh (and dL/dW) is kept, and backward scales them by the upstream
// gradient (the loss is a scalar, so that is exact).
class ChunkedLossFunction : public torch::autograd::Function<ChunkedLossFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& teacher_hidden, ChunkRun* run) {
    const at::ScalarType math = loss_math_dtype(hidden.scalar_type());
    const int64_t n = hidden.size(0);
    const bool need_dh = run->need_grad && hidden.requires_grad();
    const bool need_dw = run->need_grad && weight.requires_grad();
    at::Tensor dh = need_dh ? at::empty_like(hidden, at::MemoryFormat::Contiguous) : at::Tensor();
    at::Tensor dw = need_dw ? at::zeros(weight.sizes(), weight.options().dtype(math)) : at::Tensor();
    at::Tensor total = at::zeros({}, hidden.options().dtype(math));
    run->correct = at::zeros({n}, hidden.options().dtype(at::kBool));
    const at::Tensor weight_t = weight.t();
    for (int64_t start = 0; start < n; start += run->chunk) {
      const int64_t rows = std::min(run->chunk, n - start);
      LossChunk c = make_chunk(*run, hidden, weight_t, teacher_hidden, start, rows, need_dh || need_dw);
      // Before the author runs: a fast path may overwrite the logits.
      if (!run->reports_correct) run->correct.narrow(0, start, rows).copy_(c.logits.argmax(1).eq(c.targets));
      const at::Tensor h = hidden.narrow(0, start, rows);
      const ChunkRows out = run_chunk(*run, c);
      total.add_((c.coefficient * at::where(c.valid, out.loss.to(math), at::zeros_like(c.coefficient))).sum());
      keep_row_outputs(*run, out, c, n);
      if (need_dh) {
        at::Tensor dh_rows = dh.narrow(0, start, rows);
        at::mm_out(dh_rows, out.grad.to(hidden.scalar_type()), weight);
      }
      if (need_dw) dw.addmm_(out.grad.t().to(math), h.to(math));
    }
    ctx->saved_data["dh"] = dh;
    ctx->saved_data["dw"] = dw;
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor g = grad_outputs[0];
    const at::Tensor dh = ctx->saved_data["dh"].toTensor();
    const at::Tensor dw = ctx->saved_data["dw"].toTensor();
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    at::Tensor grad_hidden = dh.defined() ? dh * g.to(dh.scalar_type()) : at::Tensor();
    at::Tensor grad_weight = dw.defined() ? (dw * g.to(dw.scalar_type())).to(weight_dtype) : at::Tensor();
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor()};  // one per forward argument
  }
};

DFLASH_SDK_DETECT(has_rows, std::declval<const T&>().rows(std::declval<const LossChunk&>()))
DFLASH_SDK_DETECT(has_rows_and_grad, std::declval<const T&>().rows_and_grad(std::declval<const LossChunk&>()))
DFLASH_SDK_DETECT(has_logits_in_input_dtype, std::declval<const T&>().logits_in_input_dtype(std::declval<const at::Tensor&>()))
DFLASH_SDK_DETECT(has_logit_bytes, std::declval<const T&>().logit_bytes(std::declval<const LossShape&>()))
DFLASH_SDK_DETECT(has_reports_correct, T::reports_correct)

// Bytes per [chunk, V] logit element when the author does not say: sixteen
// math-dtype buffers for a graph differentiated by autograd, ten for a
// closed form, the teacher's logits included. Measured on CPU
// (tests/plugins/loss/loss_memory_test.cpp), the SDK's examples need up to 14
// (JSD: both log-softmaxes, the mixture, its stack and their gradients) and
// 8 (reverse KL). A loss that needs fewer declares logit_bytes() and gets
// larger chunks; one that needs more must.
inline double default_logit_bytes(const LossShape& shape, bool closed_form) {
  const double math = shape.element_bytes >= 8 ? 8.0 : 4.0;
  return (closed_form ? 10.0 : 16.0) * math;
}

}  // namespace detail

// The base class of a chunked loss (see the top of this file). `Derived`
// writes the chunk's mathematics; this class is the sdk::Loss the host sees.
template <class Derived>
class ChunkedLoss : public Loss {
 public:
  // `teacher`: the teacher signal the loss reads (kNone: none). It may
  // depend on the config (a blend with weight 0 reads none).
  explicit ChunkedLoss(const CreateContext& context, Teacher teacher = Teacher::kNone)
      : settings_(ChunkedLossSettings::read(context.config())), teacher_(teacher) {
    static_assert(detail::has_rows<Derived>::value || detail::has_rows_and_grad<Derived>::value,
                  "a ChunkedLoss needs `ChunkRows rows(const LossChunk&) const` (autograd) or "
                  "`ChunkRows rows_and_grad(const LossChunk&) const` (closed-form gradient)");
  }

  LossResult compute(const LossInputs& in) {
    check_loss_inputs(in, teacher_);
    const Derived& self = static_cast<const Derived&>(*this);
    const at::ScalarType math = loss_math_dtype(in.hidden.scalar_type());
    const int64_t n = in.hidden.size(0), vocab = in.lm_head_weight.size(0);

    detail::ChunkRun run;
    run.plugin = Derived::info.name;
    run.closed_form = detail::has_rows_and_grad<Derived>::value;
    if constexpr (detail::has_rows_and_grad<Derived>::value)
      run.math = [&self](LossChunk& c) { return self.rows_and_grad(c); };
    else
      run.math = [&self](LossChunk& c) { return self.rows(c); };
    if constexpr (detail::has_reports_correct<Derived>::value) run.reports_correct = Derived::reports_correct;
    if constexpr (detail::has_logits_in_input_dtype<Derived>::value)
      run.logits_in_input_dtype = self.logits_in_input_dtype(in.hidden);
    run.need_grad = c10::GradMode::is_enabled() && (in.hidden.requires_grad() || in.lm_head_weight.requires_grad());
    run.teacher = teacher_;
    run.valid = in.targets.ne(in.ignore_index);
    run.targets = at::where(run.valid, in.targets, at::zeros_like(in.targets));
    run.row_weights = in.row_weights.defined() ? in.row_weights.to(math) : at::ones({n}, in.hidden.options().dtype(math));
    run.coefficient = coefficients(run.valid, run.row_weights);
    run.topk_ids = in.teacher_topk_ids;
    run.topk_logprobs = in.teacher_topk_logprobs;
    if (teacher_ == Teacher::kHidden && in.teacher_lm_head_weight.defined()) run.teacher_weight_t = in.teacher_lm_head_weight.t();
    LossShape shape;
    shape.rows = n;
    shape.hidden = in.hidden.size(1);
    shape.vocab = vocab;
    shape.teacher = teacher_;
    shape.element_bytes = static_cast<int32_t>(in.hidden.element_size());
    shape.weight_trainable = in.lm_head_weight.requires_grad();
    shape.separate_teacher_weight = run.teacher_weight_t.defined();
    shape.teacher_hidden = shape.separate_teacher_weight ? in.teacher_lm_head_weight.size(1) : 0;
    run.chunk = chunk_rows(shape);

    const at::Tensor teacher_hidden = teacher_ == Teacher::kHidden ? in.teacher_hidden : at::empty({0}, in.hidden.options());
    LossResult result;
    result.loss = detail::ChunkedLossFunction::apply(in.hidden, in.lm_head_weight, teacher_hidden, &run);
    const c10::NoGradGuard no_grad;
    const at::Tensor valid = run.valid.to(math);
    result.metrics.set("accuracy", run.correct.to(math) * valid);
    for (const auto& [name, rows] : run.metrics) result.metrics.set(name, rows * valid);
    result.metrics.set("chunk_rows", at::scalar_tensor(static_cast<double>(run.chunk), at::kDouble));
    return result;
  }

  // One chunk's workspace, and dh [N, H] (with dW [V, H] in the math dtype
  // when the lm_head trains) and the per-row outputs, the only things kept
  // for backward. Backward then makes the gradient handed back beside dh.
  MemoryEstimate estimate_memory(const LossShape& shape) const {
    const double per_logit = logit_bytes_of(shape);
    const auto chunk = static_cast<double>(detail::chunk_rows_for(settings_, shape.rows, shape.vocab, per_logit));
    const auto workspace = static_cast<uint64_t>(chunk * static_cast<double>(shape.vocab) * per_logit);
    const auto dh = static_cast<uint64_t>(shape.rows * shape.hidden * shape.element_bytes);
    // Per-row tensors: targets, mask, weights, coefficients, hits, metrics.
    const auto per_row = static_cast<uint64_t>(shape.rows) * 16 * 8;
    uint64_t saved = dh + per_row;
    if (shape.weight_trainable) saved += static_cast<uint64_t>(shape.vocab * shape.hidden * (shape.element_bytes >= 8 ? 8 : 4));
    return {saved + std::max(workspace, dh), saved};
  }

 protected:
  const ChunkedLossSettings& chunked_settings() const { return settings_; }
  Teacher teacher() const { return teacher_; }

  // Rows per chunk for a shape: the one rule used by compute and the estimate.
  int64_t chunk_rows(const LossShape& shape) const {
    return detail::chunk_rows_for(settings_, shape.rows, shape.vocab, logit_bytes_of(shape));
  }

 private:
  double logit_bytes_of(const LossShape& shape) const {
    if constexpr (detail::has_logit_bytes<Derived>::value)
      return static_cast<const Derived&>(*this).logit_bytes(shape);
    else
      return detail::default_logit_bytes(shape, detail::has_rows_and_grad<Derived>::value);
  }

  // c_i: the row weight over the total weight of supervised rows ("mean"),
  // or the row weight ("sum"); 0 on ignored rows. No supervised row: all 0.
  at::Tensor coefficients(const at::Tensor& valid, const at::Tensor& row_weights) const {
    at::Tensor weight = valid.to(row_weights.scalar_type()) * row_weights;
    if (!settings_.mean) return weight;
    const at::Tensor total = weight.sum();
    return at::where(total.gt(0), weight / total.clamp_min(1e-30), at::zeros_like(weight));
  }

  ChunkedLossSettings settings_;
  Teacher teacher_;
};

}  // namespace dflash::sdk
