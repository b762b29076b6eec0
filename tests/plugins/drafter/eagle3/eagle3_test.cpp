// The EAGLE-3 drafter's training-time test (TTT): its layout against a loop
// over positions, and the unrolled forward against a slow fp64 reference that
// builds each query's list of keys explicitly (SpecForge's rule: step 0's
// keys of the document up to the query, then the query's own position's keys
// of steps 1 … k).
#include "draft_vocabulary.h"
#include "eagle3_model.h"
#include "ttt_attention.h"
#include "ttt_flash_attention.h"
#include "ttt_layout.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace {
using namespace dflash::eagle3;

// Two rows: the first holds two documents (lengths 6 and 5), the second one of 11.
struct Rows {
  at::Tensor ids, positions, documents, loss_mask;
};
Rows rows() {
  Rows r;
  r.ids = at::randint(0, 50, {2, 11}, at::kLong);
  r.documents = at::tensor({0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, at::kLong).view({2, 11});
  r.positions = at::tensor({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, at::kLong).view({2, 11});
  r.loss_mask = at::tensor({0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1}, at::kLong).view({2, 11});
  return r;
}

TEST(Eagle3Layout, EachStepReadsAndPredictsTheTokensAheadInsideItsDocument) {
  at::manual_seed(0);
  const Rows r = rows();
  const int64_t steps = 3;
  const TttLayout layout = layout_ttt(r.ids, r.positions, r.documents, r.loss_mask, steps);
  const int64_t length = r.ids.size(1);
  for (int64_t k = 0; k < steps; ++k)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < length; ++i) {
        SCOPED_TRACE("step " + std::to_string(k) + " row " + std::to_string(b) + " position " + std::to_string(i));
        auto doc = [&](int64_t j) { return r.documents[b][j].item<int64_t>(); };
        const bool read = i + 1 + k < length && doc(i + 1 + k) == doc(i);
        const bool taught = read && i + 2 + k < length && doc(i + 2 + k) == doc(i) && r.loss_mask[b][i + 2 + k].item<int64_t>() == 1;
        EXPECT_EQ(layout.active[k][b][i].item<bool>(), read);
        EXPECT_EQ(layout.tokens[k][b][i].item<int64_t>(), read ? r.ids[b][i + 1 + k].item<int64_t>() : 0);
        EXPECT_EQ(layout.targets[k][b][i].item<int64_t>(), taught ? r.ids[b][i + 2 + k].item<int64_t>() : -100);
        EXPECT_EQ(layout.positions[k][b][i].item<int64_t>(), r.positions[b][i].item<int64_t>() + k);
        EXPECT_EQ(layout.teacher_index[k][b][i].item<int64_t>(), std::min(i + 1 + k, length - 1));
      }
  EXPECT_THROW(layout_ttt(r.ids, r.positions, r.documents, r.loss_mask, 0), std::invalid_argument);
}

// The slow reference: one query at a time, fp64.
at::Tensor norm(const at::Tensor& x, const at::Tensor& w, double eps) { return w * x * at::rsqrt(x.pow(2).mean(-1, true) + eps); }
at::Tensor rope(const at::Tensor& x, double position, double theta) {  // x [heads, d]
  const int64_t d = x.size(-1), half = d / 2;
  at::Tensor out = x.clone();
  for (int64_t p = 0; p < half; ++p) {
    const double angle = position * std::pow(theta, -2.0 * static_cast<double>(p) / static_cast<double>(d));
    const at::Tensor a = x.select(-1, p), b = x.select(-1, p + half);
    out.select(-1, p).copy_(a * std::cos(angle) - b * std::sin(angle));
    out.select(-1, p + half).copy_(b * std::cos(angle) + a * std::sin(angle));
  }
  return out;
}

at::Tensor reference(const Eagle3Model& model, const at::Tensor& features, const at::Tensor& embeddings,
                     const TttLayout& layout, const at::Tensor& documents) {
  const Eagle3Shape& s = model.shape();
  std::map<std::string, at::Tensor> w;
  for (const auto& [name, t] : model.parameters()) w[name] = t.detach();
  const int64_t b = features.size(0), length = features.size(1), d = s.head_dim, group = s.heads / s.kv_heads;
  at::Tensor hidden = at::matmul(features, w["fc.weight"].t());
  std::vector<at::Tensor> keys, values;  // [B, S, heads, d] per step
  at::Tensor out = at::zeros({layout.steps, b, length, s.hidden}, features.options());
  for (int64_t k = 0; k < layout.steps; ++k) {
    const at::Tensor read = at::cat({norm(embeddings[k], w["midlayer.input_layernorm.weight"], s.rms_norm_eps),
                                     norm(hidden, w["midlayer.hidden_norm.weight"], s.rms_norm_eps)}, -1);
    const at::Tensor q_all = at::matmul(read, w["midlayer.self_attn.q_proj.weight"].t()).view({b, length, s.heads, d});
    const at::Tensor k_all = at::matmul(read, w["midlayer.self_attn.k_proj.weight"].t()).view({b, length, s.kv_heads, d});
    const at::Tensor v_all = at::matmul(read, w["midlayer.self_attn.v_proj.weight"].t()).view({b, length, s.kv_heads, d});
    at::Tensor q = at::empty_like(q_all), kk = at::empty_like(k_all);
    for (int64_t r = 0; r < b; ++r)
      for (int64_t i = 0; i < length; ++i) {
        const double position = static_cast<double>(layout.positions[k][r][i].item<int64_t>());
        q[r][i].copy_(rope(q_all[r][i], position, s.rope_theta));
        kk[r][i].copy_(rope(k_all[r][i], position, s.rope_theta));
      }
    keys.push_back(kk.repeat_interleave(group, 2));
    values.push_back(v_all.repeat_interleave(group, 2));
    at::Tensor attention = at::zeros({b, length, s.heads, d}, features.options());
    for (int64_t r = 0; r < b; ++r)
      for (int64_t i = 0; i < length; ++i) {
        std::vector<at::Tensor> ks, vs;
        for (int64_t j = 0; j <= i; ++j)
          if (documents[r][j].item<int64_t>() == documents[r][i].item<int64_t>()) {
            ks.push_back(keys[0][r][j]);
            vs.push_back(values[0][r][j]);
          }
        for (int64_t step = 1; step <= k; ++step) {
          ks.push_back(keys[step][r][i]);
          vs.push_back(values[step][r][i]);
        }
        const at::Tensor key = at::stack(ks, 1), value = at::stack(vs, 1);  // [heads, n, d]
        const at::Tensor p = at::softmax((q[r][i].unsqueeze(1) * key).sum(-1) / std::sqrt(double(d)), -1);  // [heads, n]
        attention[r][i].copy_((p.unsqueeze(-1) * value).sum(1));
      }
    hidden = hidden + at::matmul(attention.reshape({b, length, s.heads * d}), w["midlayer.self_attn.o_proj.weight"].t());
    const at::Tensor m = norm(hidden, w["midlayer.post_attention_layernorm.weight"], s.rms_norm_eps);
    hidden = hidden + at::matmul(at::silu(at::matmul(m, w["midlayer.mlp.gate_proj.weight"].t())) *
                                     at::matmul(m, w["midlayer.mlp.up_proj.weight"].t()),
                                 w["midlayer.mlp.down_proj.weight"].t());
    out[k].copy_(hidden);
  }
  return out;
}

Eagle3Shape small_shape() {
  Eagle3Shape s;
  s.hidden = 16;
  s.target_hidden = 12;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.intermediate = 24;
  s.draft_vocab = 20;
  s.rope_theta = 10000.0;
  return s;
}

TEST(Eagle3Model, TheUnrolledStepsMatchAQueryByQueryReference) {
  at::manual_seed(1);
  const Rows r = rows();
  const TttLayout layout = layout_ttt(r.ids, r.positions, r.documents, r.loss_mask, 3);
  const Eagle3Shape s = small_shape();
  const Eagle3Model model(s, at::TensorOptions().dtype(at::kDouble), 7);
  const at::Tensor features = at::randn({2, 11, 3 * s.target_hidden}, at::kDouble);
  const at::Tensor embeddings = at::randn({3, 2, 11, s.hidden}, at::kDouble);
  const at::Tensor ours = model.forward_ttt(features, embeddings, layout, r.documents);
  const at::Tensor theirs = reference(model, features, embeddings, layout, r.documents);
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  // The rotary angles are formed in fp32 as transformers forms them.
  EXPECT_LT((ours - theirs).abs().max().item<double>(), 1e-5);
  // Gradients reach every parameter from a later step's output.
  ours[2].sum().backward();
  for (const auto& [name, t] : model.parameters()) {
    if (name == "norm.weight" || name == "lm_head.weight") continue;  // after the steps
    ASSERT_TRUE(t.grad().defined()) << name;
    EXPECT_GT(t.grad().abs().sum().item<double>(), 0.0) << name;
  }
}

// layer_ops: fused (trainable_ops' norms and MLP, which save less and
// recompute in backward) against aten (op by op): the same outputs and the
// same gradient for every parameter. In fp64, but the op-by-op norm rounds x
// to fp32 as transformers' LlamaRMSNorm does: the two differ at fp32's
// rounding (about 1e-7 of each tensor's scale), a wrong term by far more.
TEST(Eagle3Model, FusedLayerOpsGiveTheOpByOpOutputsAndGradients) {
  at::manual_seed(3);
  const Rows r = rows();
  const TttLayout layout = layout_ttt(r.ids, r.positions, r.documents, r.loss_mask, 3);
  Eagle3Shape fused_shape = small_shape(), aten_shape = small_shape();
  fused_shape.fused_ops = true;
  aten_shape.fused_ops = false;
  const Eagle3Model fused(fused_shape, at::TensorOptions().dtype(at::kDouble), 11);
  const Eagle3Model aten(aten_shape, at::TensorOptions().dtype(at::kDouble), 11);
  const at::Tensor features = at::randn({2, 11, 3 * fused_shape.target_hidden}, at::kDouble);
  const at::Tensor embeddings = at::randn({3, 2, 11, fused_shape.hidden}, at::kDouble);
  const at::Tensor weights = at::randn({3, 2, 11, fused_shape.hidden}, at::kDouble);
  std::vector<at::Tensor> outputs;
  for (const Eagle3Model* model : {&fused, &aten}) {
    const at::Tensor out = model->forward_ttt(features, embeddings, layout, r.documents);
    (model->final_norm(out) * weights).sum().backward();
    outputs.push_back(out.detach());
  }
  EXPECT_LT((outputs[0] - outputs[1]).abs().max().item<double>(), 1e-6 * outputs[1].abs().max().item<double>());
  const auto fused_parameters = fused.parameters(), aten_parameters = aten.parameters();
  for (size_t i = 0; i < fused_parameters.size(); ++i) {
    const std::string& name = fused_parameters[i].first;
    if (name == "lm_head.weight") continue;  // not in this graph
    const at::Tensor a = fused_parameters[i].second.grad(), b = aten_parameters[i].second.grad();
    ASSERT_TRUE(a.defined() && b.defined()) << name;
    EXPECT_LT((a - b).abs().max().item<double>(), 1e-6 * b.abs().max().item<double>()) << name;
  }
}

TEST(Eagle3Model, ADocumentNeverSeesAnother) {
  at::manual_seed(2);
  const Rows r = rows();
  const TttLayout layout = layout_ttt(r.ids, r.positions, r.documents, r.loss_mask, 2);
  const Eagle3Shape s = small_shape();
  const Eagle3Model model(s, at::TensorOptions().dtype(at::kDouble), 3);
  at::Tensor features = at::randn({2, 11, 3 * s.target_hidden}, at::kDouble);
  at::Tensor embeddings = at::randn({2, 2, 11, s.hidden}, at::kDouble);
  const at::Tensor before = model.forward_ttt(features, embeddings, layout, r.documents).detach();
  // The second document of row 0 (positions 6…10) changes; the first must not.
  features.select(0, 0).narrow(0, 6, 5).normal_();
  embeddings.select(1, 0).narrow(1, 6, 5).normal_();
  const at::Tensor after = model.forward_ttt(features, embeddings, layout, r.documents).detach();
  EXPECT_TRUE(at::equal(before.select(1, 0).narrow(1, 0, 6), after.select(1, 0).narrow(1, 0, 6)));
  EXPECT_FALSE(at::equal(before.select(1, 0).narrow(1, 6, 5), after.select(1, 0).narrow(1, 6, 5)));
  EXPECT_TRUE(at::equal(before.select(1, 1), after.select(1, 1)));
}

}  // namespace

namespace {
using namespace dflash::eagle3;

// The draft vocabulary against a brute-force rule: by count, then by id.
TEST(Eagle3DraftVocabulary, TheMostFrequentTokensInIdOrderTiesToTheLowerId) {
  const at::Tensor counts = at::tensor({5, 0, 9, 5, 1, 9, 0, 2}, at::kLong);
  const DraftVocabulary v = draft_vocabulary_from_counts(counts, 4);
  // 9 (ids 2, 5), then 5 (ids 0, 3): the four, ascending.
  EXPECT_TRUE(at::equal(v.draft_to_target, at::tensor({0, 2, 3, 5}, at::kLong))) << v.draft_to_target;
  EXPECT_TRUE(at::equal(v.target_to_draft, at::tensor({0, -1, 1, 2, -1, 3, -1, -1}, at::kLong)));
  EXPECT_TRUE(at::equal(v.d2t(), at::tensor({0, 1, 1, 2}, at::kLong))) << "target = draft + d2t[draft]";
  EXPECT_TRUE(at::equal(v.t2d(), at::tensor({1, 0, 1, 1, 0, 1, 0, 0}, at::kLong).to(at::kBool)));
  // Fewer seen than wanted: the lowest unseen ids fill it.
  EXPECT_TRUE(at::equal(draft_vocabulary_from_counts(counts, 7).draft_to_target, at::tensor({0, 1, 2, 3, 4, 5, 7}, at::kLong)));
  // A random case against sorting by (−count, id).
  at::manual_seed(4);
  const at::Tensor many = at::randint(0, 6, {300}, at::kLong);
  std::vector<std::pair<int64_t, int64_t>> keyed;
  for (int64_t i = 0; i < 300; ++i) keyed.emplace_back(-many[i].item<int64_t>(), i);
  std::sort(keyed.begin(), keyed.end());
  std::vector<int64_t> expected;
  for (int64_t i = 0; i < 40; ++i) expected.push_back(keyed[static_cast<size_t>(i)].second);
  std::sort(expected.begin(), expected.end());
  EXPECT_TRUE(at::equal(draft_vocabulary_from_counts(many, 40).draft_to_target, at::tensor(expected, at::kLong)));
  // The exported d2t describes the same vocabulary.
  const DraftVocabulary back = draft_vocabulary_from_d2t(v.d2t(), 8);
  EXPECT_TRUE(at::equal(back.draft_to_target, v.draft_to_target));
}

TEST(Eagle3DraftVocabulary, ImpossibleSizesAndMapsAreRefusedByName) {
  const at::Tensor counts = at::ones({10}, at::kLong);
  for (int64_t size : {0, 11}) {
    try {
      draft_vocabulary_from_counts(counts, size);
      ADD_FAILURE() << "size " << size << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("draft_vocab_size is " + std::to_string(size) + ", but the target's vocabulary has 10"),
                std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(draft_vocabulary_from_counts(at::ones({10}, at::kFloat), 3), std::invalid_argument);
  EXPECT_THROW(draft_vocabulary_from_d2t(at::tensor({0, 0, -1}, at::kLong), 10), std::invalid_argument);  // not ascending
  EXPECT_THROW(draft_vocabulary_from_d2t(at::tensor({0, 9}, at::kLong), 10), std::invalid_argument);      // id 10 ≥ V
}

}  // namespace

namespace {
using namespace dflash::eagle3;

// Drafting ahead is what the unrolled steps trained: the context committed
// position by position, then k tokens drafted from position i, gives step k's
// training output at i when the drafted tokens are the ones training read.
TEST(Eagle3Model, DraftingAheadReproducesTheUnrolledSteps) {
  at::manual_seed(5);
  const int64_t length = 10, steps = 4;
  const Eagle3Shape s = small_shape();
  const Eagle3Model model(s, at::TensorOptions().dtype(at::kDouble), 11);
  const c10::NoGradGuard no_grad;
  const at::Tensor ids = at::randint(0, 50, {1, length}, at::kLong);
  const at::Tensor positions = at::arange(length, at::kLong).view({1, length});
  const at::Tensor documents = at::zeros({1, length}, at::kLong);
  const TttLayout layout = layout_ttt(ids, positions, documents, at::ones({1, length}, at::kLong), steps);
  const at::Tensor features = at::randn({1, length, 3 * s.target_hidden}, at::kDouble);
  const at::Tensor embeddings = at::randn({steps, 1, length, s.hidden}, at::kDouble);
  const at::Tensor trained = model.forward_ttt(features, embeddings, layout, documents);
  for (int64_t i : {0, 3, 5}) {
    SCOPED_TRACE("from position " + std::to_string(i));
    // The context 0 … i in two passes (a prompt, then one more token).
    const at::Tensor context_emb = embeddings[0][0].narrow(0, 0, i + 1), context = model.project(features[0].narrow(0, 0, i + 1));
    Eagle3Model::Pass first = model.extend(context_emb.narrow(0, 0, i), context.narrow(0, 0, i),
                                           at::arange(i, at::kLong), at::Tensor(), at::Tensor());
    Eagle3Model::Pass last = model.extend(context_emb.narrow(0, i, 1), context.narrow(0, i, 1), at::full({1}, i, at::kLong),
                                          i > 0 ? first.keys : at::Tensor(), i > 0 ? first.values : at::Tensor());
    at::Tensor keys = i > 0 ? at::cat({first.keys, last.keys}, 1) : last.keys;
    at::Tensor values = i > 0 ? at::cat({first.values, last.values}, 1) : last.values;
    EXPECT_LT((last.out[0] - trained[0][0][i]).abs().max().item<double>(), 1e-6) << "step 0";
    at::Tensor hidden = last.out;
    for (int64_t k = 1; k < steps && i + 1 + k < length; ++k) {
      const Eagle3Model::Pass ahead =
          model.extend(embeddings[k][0].narrow(0, i, 1), hidden, at::full({1}, i + k, at::kLong), keys, values);
      EXPECT_LT((ahead.out[0] - trained[k][0][i]).abs().max().item<double>(), 1e-6) << "step " << k;
      keys = at::cat({keys, ahead.keys}, 1);
      values = at::cat({values, ahead.values}, 1);
      hidden = ahead.out;
    }
  }
}

}  // namespace

namespace {

// The dense form ttt_attention replaces: one [S, S] score matrix a head.
at::Tensor dense_ttt_attention(const at::Tensor& q, const at::Tensor& key0, const at::Tensor& value0,
                               const std::vector<at::Tensor>& own_keys, const std::vector<at::Tensor>& own_values,
                               const at::Tensor& documents, double scale) {
  const int64_t group = q.size(1) / key0.size(1), length = q.size(2);
  auto per_head = [&](const at::Tensor& x) { return x.repeat_interleave(group, 1); };
  const at::Tensor index = at::arange(length, documents.options());
  const at::Tensor visible =
      documents.unsqueeze(2).eq(documents.unsqueeze(1)).logical_and(index.view({1, -1, 1}).ge(index.view({1, 1, -1}))).unsqueeze(1);
  std::vector<at::Tensor> scores{(at::matmul(q, per_head(key0).transpose(2, 3)) * scale)
                                     .masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity())};
  for (const at::Tensor& k : own_keys) scores.push_back((q * per_head(k)).sum(-1, true) * scale);
  const at::Tensor weights = at::softmax(at::cat(scores, -1), -1);
  at::Tensor out = at::matmul(weights.narrow(-1, 0, length), per_head(value0));
  for (size_t j = 0; j < own_values.size(); ++j)
    out = out + weights.narrow(-1, length + static_cast<int64_t>(j), 1) * per_head(own_values[j]);
  return out;
}

}  // namespace

// The chunked attention against the dense form, in fp64: outputs and every
// gradient, with 2 query heads per KV head, two documents in a row, steps 0
// to 3 (0 to 3 own keys), and chunks of 1, 5 and all 13 rows.
TEST(Eagle3TttAttention, ChunkedMatchesTheDenseFormAndItsGradients) {
  at::manual_seed(11);
  const int64_t b = 2, heads = 4, kv = 2, length = 13, d = 8;
  const at::Tensor documents =
      at::tensor({0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, at::kLong).view({b, length});
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t own = 0; own <= 3; ++own)
    for (int64_t rows : {int64_t{1}, int64_t{5}, length}) {
      SCOPED_TRACE("own keys " + std::to_string(own) + ", chunk rows " + std::to_string(rows));
      auto leaf = [&](int64_t h) { return at::randn({b, h, length, d}, at::kDouble).requires_grad_(true); };
      const at::Tensor q = leaf(heads), key0 = leaf(kv), value0 = leaf(kv);
      std::vector<at::Tensor> ok, ov;
      for (int64_t j = 0; j < own; ++j) {
        ok.push_back(leaf(kv));
        ov.push_back(leaf(kv));
      }
      const int64_t bytes = rows * b * heads * length * 4;  // exactly `rows` rows a chunk
      ASSERT_EQ(ttt_attention_chunk_rows(b, heads, length, bytes), rows);
      const at::Tensor chunked = ttt_attention(q, key0, value0, ok, ov, documents, scale, bytes);
      const at::Tensor dense = dense_ttt_attention(q, key0, value0, ok, ov, documents, scale);
      EXPECT_LT((chunked - dense).abs().max().item<double>(), 1e-12);
      const at::Tensor weight = at::randn(dense.sizes(), at::kDouble);
      std::vector<at::Tensor> inputs{q, key0, value0};
      inputs.insert(inputs.end(), ok.begin(), ok.end());
      inputs.insert(inputs.end(), ov.begin(), ov.end());
      const auto g_chunked = torch::autograd::grad({(chunked * weight).sum()}, inputs);
      const auto g_dense = torch::autograd::grad({(dense * weight).sum()}, inputs);
      for (size_t i = 0; i < inputs.size(); ++i)
        EXPECT_LT((g_chunked[i] - g_dense[i]).abs().max().item<double>(), 1e-12) << "gradient of input " << i;
    }
  EXPECT_THROW(ttt_attention(at::zeros({1, 3, 4, 8}), at::zeros({1, 2, 4, 8}), at::zeros({1, 2, 4, 8}), {}, {},
                             at::zeros({1, 4}, at::kLong), 1.0),
               std::invalid_argument);
}

// The flash path (GPU, bf16) against the dense form in fp64 on the same
// bf16 values: outputs and every gradient, with 4 query heads per KV head,
// three documents over two rows, and 0 to 3 own keys. Tolerances are bf16's
// (the flash kernels round their probabilities to bf16 before P·V).
TEST(Eagle3TttAttention, FlashMatchesTheDenseFormAndItsGradientsOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(12);
  const int64_t b = 2, heads = 8, kv = 2, length = 300, d = 64;
  const at::Tensor documents = at::cat({at::zeros({1, 120}, at::kLong), at::ones({1, 180}, at::kLong),
                                        at::zeros({1, length}, at::kLong)}, 1).view({b, length});
  const TttSequences sequences = ttt_sequences(documents, at::Device(at::kCUDA));
  ASSERT_EQ(sequences.max_length, length);
  ASSERT_EQ(sequences.cu_seqlens.cpu().sizes(), at::IntArrayRef({4}));
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  for (int64_t own = 0; own <= 3; ++own) {
    SCOPED_TRACE("own keys " + std::to_string(own));
    auto leaf = [&](int64_t h) { return at::randn({b, h, length, d}, bf16).requires_grad_(true); };
    auto exact = [](const at::Tensor& x) { return x.detach().to(at::kCPU, at::kDouble).requires_grad_(true); };
    const at::Tensor q = leaf(heads), key0 = leaf(kv), value0 = leaf(kv);
    std::vector<at::Tensor> ok, ov;
    for (int64_t j = 0; j < own; ++j) {
      ok.push_back(leaf(kv));
      ov.push_back(leaf(kv));
    }
    std::vector<at::Tensor> inputs{q, key0, value0};
    inputs.insert(inputs.end(), ok.begin(), ok.end());
    inputs.insert(inputs.end(), ov.begin(), ov.end());
    std::vector<at::Tensor> exact_inputs;
    for (const at::Tensor& x : inputs) exact_inputs.push_back(exact(x));
    const std::vector<at::Tensor> exact_ok(exact_inputs.begin() + 3, exact_inputs.begin() + 3 + own),
        exact_ov(exact_inputs.begin() + 3 + own, exact_inputs.end());
    const at::Tensor flash = ttt_flash_attention(q, key0, value0, ok, ov, sequences, scale);
    const at::Tensor dense =
        dense_ttt_attention(exact_inputs[0], exact_inputs[1], exact_inputs[2], exact_ok, exact_ov, documents, scale);
    const double out_scale = dense.abs().max().item<double>();
    EXPECT_LT((flash.to(at::kCPU, at::kDouble) - dense).abs().max().item<double>(), 2e-2 * out_scale);
    const at::Tensor weight = at::randn(dense.sizes(), at::kDouble);
    const auto g_flash = torch::autograd::grad({(flash.to(at::kFloat) * weight.to(flash.device(), at::kFloat)).sum()}, inputs);
    const auto g_dense = torch::autograd::grad({(dense * weight).sum()}, exact_inputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const double g_scale = g_dense[i].abs().max().item<double>();
      EXPECT_LT((g_flash[i].to(at::kCPU, at::kDouble) - g_dense[i]).abs().max().item<double>(), 3e-2 * g_scale)
          << "gradient of input " << i;
    }
  }
}

// Documents as varlen sequences: a new sequence at each row's start and
// at each change of document id; each token's sequence and offset.
TEST(Eagle3TttAttention, DocumentsBecomeOneSequenceEachRowByRow) {
  const at::Tensor documents = at::tensor({0, 0, 1, 1, 1, 7, 7, 7, 7, 7}, at::kLong).view({2, 5});
  const TttSequences s = ttt_sequences(documents, at::Device(at::kCPU));
  EXPECT_TRUE(at::equal(s.cu_seqlens, at::tensor({0, 2, 5, 10}, at::kInt)));
  EXPECT_EQ(s.max_length, 5);
  EXPECT_TRUE(at::equal(s.token_sequence, at::tensor({0, 0, 1, 1, 1, 2, 2, 2, 2, 2}, at::kLong)));
  EXPECT_TRUE(at::equal(s.token_offset, at::tensor({0, 1, 0, 1, 2, 0, 1, 2, 3, 4}, at::kLong)));
}
