// drafter/dflash: the anchor sampler, the block layout and the attention mask
// against direct slow references, and a whole drafter step (loss and every
// parameter's gradient) against a naive per-block implementation in fp64.
#include "block_layout.h"
#include "plugins/drafter/dflash/drafter_test_shapes.h"
#include "dflash_model.h"
#include "grouped_attention.h"
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "support/expect.h"

#include <cuda_graph.h>
#include <kernel_ops.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>

namespace {
using namespace dflash::host;
namespace dd = dflash::drafter;

torch::Tensor get(const NamedTensors& t, const std::string& name) {
  for (const auto& [n, tensor] : t)
    if (n == name) return tensor;
  ADD_FAILURE() << "missing " << name;
  return {};
}

// Row 0: one document, a few unsupervised stretches. Row 1: three documents.
// A loss whose gradients stand far above bf16 rounding: a fixed, varying
// projection of the hidden states. (The sum of squares of RMS-normalised
// states is nearly constant, so its true gradients are near zero and a
// bf16 run's are rounding noise: kernels could not be told apart by them.)
torch::Tensor projected_sum(const torch::Tensor& hidden) {
  const auto wide = hidden.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const auto pattern = torch::sin(torch::arange(hidden.numel(), hidden.options().dtype(wide))).view(hidden.sizes());
  return (hidden.to(wide) * pattern).sum();
}

struct SmallBatch {
  torch::Tensor ids, loss_mask, positions, documents;
};
SmallBatch small_batch(int64_t length, uint64_t seed) {
  torch::manual_seed(seed);
  SmallBatch b;
  b.ids = torch::randint(1, 38, {2, length}, torch::kLong);
  b.loss_mask = torch::rand({2, length}).gt(0.25).to(torch::kLong);
  b.loss_mask.index_put_({0, torch::indexing::Slice(0, 3)}, 0);  // a prompt
  std::vector<int64_t> docs1;
  for (int64_t i = 0; i < length; ++i) docs1.push_back(i < length / 3 ? 0 : i < 2 * length / 3 ? 1 : 2);
  b.documents = torch::stack({torch::zeros({length}, torch::kLong), torch::tensor(docs1)});
  b.positions = torch::zeros({2, length}, torch::kLong);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t i = 0; i < length; ++i)
      b.positions[r][i] = (i == 0 || b.documents[r][i].item<int64_t>() != b.documents[r][i - 1].item<int64_t>())
                              ? 0
                              : b.positions[r][i - 1].item<int64_t>() + 1;
  return b;
}

TEST(DFlashLayout, AnchorSamplerDrawsDistinctSupervisedPairsUniformly) {
  const SmallBatch b = small_batch(40, 1);
  for (int64_t r = 0; r < 2; ++r) {
    std::set<int64_t> slow;  // token and next supervised, same document
    for (int64_t p = 0; p + 1 < 40; ++p)
      if (b.loss_mask[r][p].item<int64_t>() && b.loss_mask[r][p + 1].item<int64_t>() &&
          b.documents[r][p].item<int64_t>() == b.documents[r][p + 1].item<int64_t>())
        slow.insert(p);
    const auto fast = dd::anchor_candidates(b.loss_mask[r].contiguous().data_ptr<int64_t>(),
                                            b.documents[r].contiguous().data_ptr<int64_t>(), 40);
    EXPECT_EQ(std::set<int64_t>(fast.begin(), fast.end()), slow);
    EXPECT_EQ(fast.size(), slow.size());
  }
  const auto a = dd::sample_anchors(b.loss_mask, b.documents, 5, 11);
  EXPECT_TRUE(torch::equal(a, dd::sample_anchors(b.loss_mask, b.documents, 5, 11))) << "fixed by the seed";
  EXPECT_FALSE(torch::equal(a, dd::sample_anchors(b.loss_mask, b.documents, 5, 12)));
  ASSERT_EQ(a.size(1), 5);
  // Uniform without replacement: over many seeds every candidate of row 0 is
  // drawn about max_anchors / candidates of the time.
  const auto candidates = dd::anchor_candidates(b.loss_mask[0].contiguous().data_ptr<int64_t>(),
                                                b.documents[0].contiguous().data_ptr<int64_t>(), 40);
  std::map<int64_t, int> drawn;
  const int trials = 4000;
  for (int seed = 0; seed < trials; ++seed) {
    const auto row = dd::sample_anchors(b.loss_mask, b.documents, 5, seed)[0];
    std::set<int64_t> distinct;
    for (int64_t i = 0; i < 5; ++i) {
      const int64_t p = row[i].item<int64_t>();
      if (i > 0) EXPECT_LT(row[i - 1].item<int64_t>(), p) << "ascending";
      distinct.insert(p);
      ++drawn[p];
    }
    EXPECT_EQ(distinct.size(), 5u);
  }
  const double expected = trials * 5.0 / static_cast<double>(candidates.size());
  for (int64_t p : candidates) EXPECT_NEAR(drawn[p], expected, 0.15 * expected) << "candidate " << p;
  EXPECT_EQ(drawn.size(), candidates.size()) << "only candidates are drawn";
  // Fewer candidates than max_anchors: all of them, padded with −1 on shorter rows.
  const auto all = dd::sample_anchors(b.loss_mask, b.documents, 1000, 3);
  EXPECT_EQ(all.size(1), static_cast<int64_t>(std::max(candidates.size(), dd::anchor_candidates(
      b.loss_mask[1].contiguous().data_ptr<int64_t>(), b.documents[1].contiguous().data_ptr<int64_t>(), 40).size())));
}

TEST(DFlashLayout, BlocksAndMaskMatchTheirDefinitions) {
  const SmallBatch b = small_batch(30, 2);
  const int64_t bs = 4, mask_id = 39;
  const auto anchors = dd::sample_anchors(b.loss_mask, b.documents, 4, 5);
  auto padded = anchors.clone();
  padded[1][3] = -1;  // a padding block
  const auto layout = dd::layout_blocks(b.ids, b.positions, b.documents, b.loss_mask, padded, bs, mask_id);
  const auto mask = dd::block_attention_mask(padded, b.documents, bs);
  const int64_t count = padded.size(1), s = 30, q = count * bs;
  ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{2, q, s + q}));
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t blk = 0; blk < count; ++blk) {
      const int64_t a = padded[r][blk].item<int64_t>();
      for (int64_t k = 0; k < bs; ++k) {
        const int64_t slot = blk * bs + k;
        SCOPED_TRACE("row " + std::to_string(r) + " block " + std::to_string(blk) + " slot " + std::to_string(k));
        EXPECT_EQ(layout.block_valid[r][slot].item<bool>(), a >= 0);
        if (a >= 0) {
          EXPECT_EQ(layout.slot_ids[r][slot].item<int64_t>(), k == 0 ? b.ids[r][a].item<int64_t>() : mask_id);
          EXPECT_EQ(layout.slot_positions[r][slot].item<int64_t>(), b.positions[r][a].item<int64_t>() + k);
          const int64_t p = a + k;
          const bool supervised = k >= 1 && p < s && b.documents[r][p].item<int64_t>() == b.documents[r][a].item<int64_t>() &&
                                  b.loss_mask[r][p].item<int64_t>() == 1;
          EXPECT_EQ(layout.targets[r][slot].item<int64_t>(), supervised ? b.ids[r][p].item<int64_t>() : -100);
          if (supervised) EXPECT_EQ(layout.teacher_index[r][slot].item<int64_t>(), p - 1);
        }
        for (int64_t key = 0; key < s + q; ++key) {
          bool allowed;
          if (key < s) allowed = a >= 0 && key < a && b.documents[r][key].item<int64_t>() == b.documents[r][a].item<int64_t>();
          else allowed = (key - s) / bs == blk;  // own block, both directions
          ASSERT_EQ(mask[r][slot][key].item<bool>(), allowed) << "key " << key;
        }
      }
    }
  // The grouped form (what the layers use by default) covers exactly the
  // same pattern: every block in one group, in order; each group's mask is
  // the dense mask's entries on its rows and columns, and the dense mask
  // allows nothing on those rows outside the group's columns.
  // Widened ranges (key_multiple) hold the same pattern: the extra keys are masked.
  for (int64_t key_multiple : {1, 4, 1000})
  for (int64_t group_blocks : {1, 2, 3, 100}) {
    SCOPED_TRACE("group_blocks " + std::to_string(group_blocks) + ", key_multiple " + std::to_string(key_multiple));
    const auto groups = dd::attention_groups(padded, b.documents, group_blocks, key_multiple);
    int64_t next_row = 0, next_block = 0;
    for (const auto& g : groups) {
      if (g.row != next_row) {
        EXPECT_EQ(next_block, count) << "a row's blocks all lie in its groups";
        next_row = g.row;
        next_block = 0;
      }
      ASSERT_EQ(g.first_block, next_block);
      ASSERT_LE(g.blocks, group_blocks);
      ASSERT_GE(g.context_begin, 0);
      ASSERT_LE(g.context_begin, g.context_end);
      ASSERT_LE(g.context_end, s);
      const int64_t length = g.context_end - g.context_begin;
      if (length > 0) EXPECT_TRUE(length % key_multiple == 0 || length == s) << "range of " << length << " keys";
      next_block += g.blocks;
    }
    EXPECT_EQ(next_row, 1);
    EXPECT_EQ(next_block, count);
    // The masks as the layers make them: groups of one shape stacked, each
    // group's mask at its place in the stack.
    std::map<std::pair<int64_t, int64_t>, std::vector<dd::AttentionGroup>> shapes;
    for (const auto& g : groups) shapes[{g.blocks, g.context_end - g.context_begin}].push_back(g);
    for (const auto& [dims, members] : shapes) {
      const auto stacked = dd::stacked_group_attention_masks(members, padded, b.documents, bs);
      ASSERT_EQ(stacked.size(0), static_cast<int64_t>(members.size()));
      for (size_t i = 0; i < members.size(); ++i) {
        const auto& g = members[i];
        const auto group_mask = stacked[static_cast<int64_t>(i)];
        const int64_t rows0 = g.first_block * bs, queries = g.blocks * bs, context = g.context_end - g.context_begin;
        ASSERT_EQ(group_mask.sizes(), (std::vector<int64_t>{queries, context + queries}));
        const auto dense_rows = mask[g.row].narrow(0, rows0, queries);
        EXPECT_TRUE(torch::equal(group_mask.narrow(1, 0, context), dense_rows.narrow(1, g.context_begin, context)));
        EXPECT_TRUE(torch::equal(group_mask.narrow(1, context, queries), dense_rows.narrow(1, s + rows0, queries)));
        EXPECT_EQ(dense_rows.sum().item<int64_t>(), group_mask.sum().item<int64_t>())
            << "nothing allowed outside the group's keys";
      }
    }
  }
  EXPECT_THROW(dd::attention_groups(padded, b.documents, 0), std::invalid_argument);

  const auto w = dd::slot_weights(5, 4.0);
  EXPECT_EQ(w[0].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(w[1].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(w[3].item<float>(), static_cast<float>(std::exp(-2.0 / 4.0)));
}

// The block kernel's layout (attention: blocks) covers exactly the mask's
// allowed pairs, each once: the prefix calls (no mask; lengths a multiple of
// key_multiple) and the kernel's entries together. Every key an entry sees
// lies in exactly one key tile, and that tile lists the entry (the kernel's
// backward writes each key's gradient from its one tile).
TEST(DFlashLayout, BlockKernelLayoutCoversTheMaskOnceAndTilesEveryKeySeen) {
  const SmallBatch b = small_batch(200, 4);
  const int64_t s = 200;
  for (int64_t bs : {16, 32})
    for (const auto& [group_blocks, key_multiple] : std::vector<std::pair<int64_t, int64_t>>{{2, 8}, {3, 64}, {100, 1}}) {
      SCOPED_TRACE("block " + std::to_string(bs) + ", group_blocks " + std::to_string(group_blocks) + ", key_multiple " +
                   std::to_string(key_multiple));
      auto anchors = dd::sample_anchors(b.loss_mask, b.documents, 9, 3);
      anchors[1][8] = -1;  // a padding block
      const auto mask = dd::block_attention_mask(anchors, b.documents, bs);
      const int64_t q = anchors.size(1) * bs, row_keys = s + q;
      const dd::BlockKernelLayout layout = dd::block_kernel_layout(anchors, b.documents, bs, group_blocks, key_multiple);
      auto covered = torch::zeros({2, q, row_keys}, torch::kLong);
      auto c = covered.accessor<int64_t, 3>();
      EXPECT_FALSE(layout.prefixes.empty());
      for (const dd::PrefixCall& p : layout.prefixes) {
        EXPECT_EQ(p.keys % key_multiple, 0);
        EXPECT_GT(p.keys, 0);
        const int64_t r = p.query_row / q;
        for (int64_t i = p.query_row; i < p.query_row + p.queries; ++i)
          for (int64_t k = p.key_row; k < p.key_row + p.keys; ++k) ++c[r][i - r * q][k - r * row_keys];
      }
      ASSERT_EQ(static_cast<int64_t>(layout.blocks.size()), 2 * q / 16);
      std::map<std::pair<int64_t, int64_t>, int> seen_by;  // (entry, flat key row) → tiles listing it
      for (size_t e = 0; e < layout.blocks.size(); ++e) {
        const auto& entry = layout.blocks[e];
        const int64_t r = entry.query_row / q;
        ASSERT_EQ(entry.slot_count, bs);
        std::vector<int64_t> keys;
        for (int64_t p = entry.context_begin; p < entry.context_end; ++p) keys.push_back(entry.key_row + p);
        for (int64_t j = 0; j < entry.slot_count; ++j) keys.push_back(entry.slot_row + j);
        for (int64_t i = entry.query_row; i < entry.query_row + 16; ++i)
          for (int64_t k : keys) ++c[r][i - r * q][k - r * row_keys];
        for (int64_t k : keys) seen_by[{static_cast<int64_t>(e), k}] = 0;
      }
      EXPECT_TRUE(torch::equal(covered, mask.to(torch::kLong))) << "every allowed pair once, nothing else";
      for (const auto& t : layout.tiles) {
        ASSERT_LE(0, t.lo);
        ASSERT_LE(t.hi, 64);
        for (int32_t e = t.first_block; e < t.last_block; ++e) {
          const auto& entry = layout.blocks[static_cast<size_t>(e)];
          for (int64_t i = t.lo; i < t.hi; ++i) {
            const int64_t k = t.key_row + i;
            const bool sees = t.position0 >= 0 ? (t.position0 + i >= entry.context_begin && t.position0 + i < entry.context_end &&
                                                  k == entry.key_row + t.position0 + i)
                                               : (k >= entry.slot_row && k < entry.slot_row + entry.slot_count);
            if (sees) {
              auto it = seen_by.find({e, k});
              ASSERT_NE(it, seen_by.end()) << "tile key " << k << " not seen by entry " << e;
              ++it->second;
            }
          }
        }
      }
      for (const auto& [pair, tiles] : seen_by) EXPECT_EQ(tiles, 1) << "entry " << pair.first << ", key row " << pair.second;
    }
}

// ---- a whole drafter step against a naive implementation ---------------------

// The block kernel's block sizes: one rule (block_size_fits), and the words
// that messages and the schema print come from it; a layout for any other
// size is refused with those words.
TEST(DFlashLayout, TheBlockKernelsSizesAreStatedOnceAndRefusedByTheirRule) {
  std::string listed;
  for (int64_t size = 1; size <= 2 * dflash::cuda_kernels::kMaxSlots; ++size)
    if (dflash::cuda_kernels::block_size_fits(size)) listed += (listed.empty() ? "" : " ") + std::to_string(size);
  EXPECT_EQ(listed, "16 32 48 64");
  EXPECT_EQ(dflash::cuda_kernels::block_sizes_in_words(), "16, 32, 48 or 64");
  const torch::Tensor anchors = torch::zeros({1, 1}, torch::kLong), documents = torch::zeros({1, 8}, torch::kLong);
  EXPECT_THROW_WITH(dflash::drafter::block_kernel_layout(anchors, documents, 8, 1, 1), std::invalid_argument,
                    "block_size is 8; the kernels take 16, 32, 48 or 64");
}

torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w) { return w * x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-6); }

torch::Tensor naive_rope(const torch::Tensor& x, const torch::Tensor& positions, double theta) {  // x [L, d]
  const int64_t d = x.size(-1), half = d / 2;
  auto out = x.clone();
  for (int64_t j = 0; j < half; ++j) {
    const auto angle = positions.to(torch::kDouble) * std::pow(theta, -2.0 * j / d);
    const auto a = x.select(-1, j), c = x.select(-1, j + half);
    out.select(-1, j).copy_(a * angle.cos() - c * angle.sin());
    out.select(-1, j + half).copy_(c * angle.cos() + a * angle.sin());
  }
  return out;
}

TEST(DFlashDrafter, StepLossAndGradientsMatchANaivePerBlockImplementation) {
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  const PluginRecord& record = registry.find(DFLASH_KIND_DRAFTER, "dflash");
  const int64_t bs = 4, h = 16, heads = 4, kv = 2, d = 8, inter = 24, vocab = 40, length = 24;
  const nlohmann::json config = {{"num_layers", 2}, {"num_attention_heads", 0}, {"num_key_value_heads", 0},
                                 {"head_dim", 0}, {"intermediate_size", 0}, {"block_size", bs}, {"max_anchors", 3},
                                 {"gamma", 0.0}, {"mask_token_id", -1}, {"target_layer_ids", nlohmann::json::array()},
                                 {"init_std", 0.3}, {"rope_theta", 0.0}, {"activation_checkpointing", false},
                                 {"attention", "grouped"}, {"attention_group_blocks", 2}, {"attention_group_key_multiple", 4}};  // 2 groups per row, ranges of 4k keys
  DrafterInstance drafter(record, config, {"cpu", "float64", 9});
  const nlohmann::json target = {{"num_layers", 6}, {"hidden_size", h}, {"vocab_size", vocab}, {"num_attention_heads", heads},
                                 {"num_key_value_heads", kv}, {"head_dim", d}, {"intermediate_size", inter},
                                 {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6}};
  torch::manual_seed(4);
  const auto embed = torch::randn({vocab, h}, torch::kDouble), lm_head = torch::randn({vocab, h}, torch::kDouble) * 0.3;
  const auto final_norm = 1 + 0.1 * torch::randn({h}, torch::kDouble);
  drafter.bind_target(target, {{"embed_tokens", embed}, {"lm_head", lm_head}, {"final_norm", final_norm}});
  const nlohmann::json exported = *drafter.export_config();
  EXPECT_EQ(exported.at("target_layer_ids"), (nlohmann::json{1, 3})) << "2 layers spaced from 1 to L − 3 = 3";
  EXPECT_EQ(exported.at("mask_token_id"), vocab - 1);
  EXPECT_EQ(exported.at("block_size"), bs);

  const SmallBatch b = small_batch(length, 6);
  const auto f1 = torch::randn({2, length, h}, torch::kDouble), f3 = torch::randn({2, length, h}, torch::kDouble);
  const int64_t seed = 77;
  const NamedTensors out = drafter.forward({{"input_ids", b.ids}, {"loss_mask", b.loss_mask}, {"position_ids", b.positions},
                                            {"document_ids", b.documents}, {"hidden.1", f1}, {"hidden.3", f3},
                                            {"sample_seed", torch::tensor(seed)}});
  const auto rows_hidden = get(out, "hidden"), targets = get(out, "targets"), weights = get(out, "row_weights");
  auto loss_of = [&](const torch::Tensor& hidden_rows, const torch::Tensor& tgt, const torch::Tensor& w) {
    const auto valid = tgt.ne(-100);
    const auto ce = torch::nn::functional::cross_entropy(torch::matmul(hidden_rows, lm_head.t()), tgt.clamp_min(0),
                                                         torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    const auto wv = w.to(torch::kDouble) * valid.to(torch::kDouble);
    return (wv * ce).sum() / wv.sum();
  };
  const auto loss = loss_of(rows_hidden, targets, weights);
  loss.backward();
  const NamedTensors params = drafter.parameters();

  // The naive model: same weights as fresh leaves.
  std::map<std::string, torch::Tensor> w;
  for (const auto& [name, p] : params) w[name] = p.detach().clone().requires_grad_(true);
  const auto anchors = dd::sample_anchors(b.loss_mask, b.documents, 3, seed);
  const auto ctx_all = rms(torch::matmul(torch::cat({f1, f3}, -1), w["fc.weight"].t()), w["hidden_norm.weight"]);
  const double gamma = 2.0;  // block_size 4 → the recipe's γ for small blocks
  std::vector<torch::Tensor> terms, term_weights;
  int64_t rows_expected = 0;
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t blk = 0; blk < anchors.size(1); ++blk) {
      const int64_t a = anchors[r][blk].item<int64_t>();
      if (a < 0) continue;
      std::vector<int64_t> slot_ids = {b.ids[r][a].item<int64_t>()};
      for (int64_t k = 1; k < bs; ++k) slot_ids.push_back(vocab - 1);
      auto x = embed.index_select(0, torch::tensor(slot_ids));
      const auto qpos = b.positions[r][a] + torch::arange(bs);
      std::vector<int64_t> ctx_index;
      for (int64_t j = 0; j < a; ++j)
        if (b.documents[r][j].item<int64_t>() == b.documents[r][a].item<int64_t>()) ctx_index.push_back(j);
      const auto ci = torch::tensor(ctx_index, torch::kLong);
      const auto ctx = ctx_all[r].index_select(0, ci);
      const auto cpos = b.positions[r].index_select(0, ci);
      for (int64_t l = 0; l < 2; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        const auto hn = rms(x, w[p + "input_layernorm.weight"]);
        const auto q = torch::matmul(hn, w[p + "self_attn.q_proj.weight"].t());
        const auto kc = torch::matmul(ctx, w[p + "self_attn.k_proj.weight"].t()), kb = torch::matmul(hn, w[p + "self_attn.k_proj.weight"].t());
        const auto vc = torch::matmul(ctx, w[p + "self_attn.v_proj.weight"].t()), vb = torch::matmul(hn, w[p + "self_attn.v_proj.weight"].t());
        std::vector<torch::Tensor> outs;
        for (int64_t head = 0; head < heads; ++head) {
          const int64_t g = head / (heads / kv);
          auto qh = naive_rope(rms(q.narrow(1, head * d, d), w[p + "self_attn.q_norm.weight"]), qpos, 10000.0);
          auto kh = torch::cat({naive_rope(rms(kc.narrow(1, g * d, d), w[p + "self_attn.k_norm.weight"]), cpos, 10000.0),
                                naive_rope(rms(kb.narrow(1, g * d, d), w[p + "self_attn.k_norm.weight"]), qpos, 10000.0)});
          auto vh = torch::cat({vc.narrow(1, g * d, d), vb.narrow(1, g * d, d)});
          outs.push_back(torch::matmul(torch::softmax(torch::matmul(qh, kh.t()) / std::sqrt(static_cast<double>(d)), 1), vh));
        }
        x = x + torch::matmul(torch::cat(outs, 1), w[p + "self_attn.o_proj.weight"].t());
        const auto m = rms(x, w[p + "post_attention_layernorm.weight"]);
        const auto gate = torch::matmul(m, w[p + "mlp.gate_proj.weight"].t());
        x = x + torch::matmul(gate * torch::sigmoid(gate) * torch::matmul(m, w[p + "mlp.up_proj.weight"].t()),
                              w[p + "mlp.down_proj.weight"].t());
      }
      const auto y = rms(x, w["norm.weight"]);
      for (int64_t k = 1; k < bs; ++k) {
        ++rows_expected;
        const int64_t pos = a + k;
        if (pos >= length || b.documents[r][pos].item<int64_t>() != b.documents[r][a].item<int64_t>() ||
            b.loss_mask[r][pos].item<int64_t>() == 0)
          continue;
        const auto logp = torch::log_softmax(torch::matmul(y[k], lm_head.t()), 0);
        // Row weights travel as fp32 (the loss ABI's row_weights are float).
        const double wk = static_cast<double>(static_cast<float>(std::exp(-(k - 1) / gamma)));
        terms.push_back(-logp[b.ids[r][pos].item<int64_t>()] * wk);
        term_weights.push_back(torch::tensor(wk, torch::kDouble));
      }
    }
  ASSERT_FALSE(terms.empty());
  EXPECT_EQ(rows_hidden.size(0), rows_expected) << "one row per slot k ≥ 1 of every block";
  const auto naive_loss = torch::stack(terms).sum() / torch::stack(term_weights).sum();
  naive_loss.backward();
  EXPECT_NEAR(loss.item<double>(), naive_loss.item<double>(), 1e-10);
  for (const auto& [name, p] : params) {
    ASSERT_TRUE(p.grad().defined()) << name << " got no gradient";
    const double err = (p.grad() - w[name].grad()).abs().max().item<double>();
    const double scale = w[name].grad().abs().max().item<double>();
    EXPECT_LE(err, 1e-9 * std::max(1.0, scale)) << name << ": max abs diff " << err << " at scale " << scale;
  }
  EXPECT_FALSE(embed.requires_grad()) << "the target's embedding stays frozen";

  // The teacher rows: the target's last hidden state one position before each target token.
  const auto last = torch::randn({2, length, h}, torch::kDouble);
  const NamedTensors with_teacher = drafter.forward({{"input_ids", b.ids}, {"loss_mask", b.loss_mask},
                                                     {"position_ids", b.positions}, {"document_ids", b.documents},
                                                     {"hidden.1", f1}, {"hidden.3", f3}, {"last_hidden", last},
                                                     {"sample_seed", torch::tensor(seed)}});
  const auto teacher = get(with_teacher, "teacher_hidden"), slots = get(with_teacher, "slot"), tg = get(with_teacher, "targets");
  int64_t row = 0, checked = 0;
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t blk = 0; blk < anchors.size(1); ++blk) {
      const int64_t a = anchors[r][blk].item<int64_t>();
      if (a < 0) continue;
      for (int64_t k = 1; k < bs; ++k, ++row) {
        EXPECT_EQ(slots[row].item<int64_t>(), k);
        if (tg[row].item<int64_t>() == -100) continue;
        EXPECT_TRUE(torch::equal(teacher[row], last[r][a + k - 1]));
        ++checked;
      }
    }
  EXPECT_GT(checked, 0);
}

// Activation checkpointing recomputes each layer in backward, the embedding
// may live in host memory, attention may run grouped (any group size) or as
// one dense call, and the layers' norms, RoPE and MLP may run as the fused
// autograd functions (the default) or op by op: the same loss and the same
// gradients every way.
TEST(DFlashDrafter, ActivationCheckpointingGivesTheSameGradients) {
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  const PluginRecord& record = registry.find(DFLASH_KIND_DRAFTER, "dflash");
  nlohmann::json config = {{"num_layers", 3}, {"num_attention_heads", 0}, {"num_key_value_heads", 0}, {"head_dim", 0},
                           {"intermediate_size", 0}, {"block_size", 4}, {"max_anchors", 4}, {"gamma", 0.0},
                           {"mask_token_id", -1}, {"target_layer_ids", nlohmann::json::array()}, {"init_std", 0.3},
                           {"rope_theta", 0.0}, {"activation_checkpointing", false}};
  const nlohmann::json target = {{"num_layers", 6}, {"hidden_size", 16}, {"vocab_size", 40}, {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2}, {"head_dim", 8}, {"intermediate_size", 24}};
  torch::manual_seed(8);
  const NamedTensors frozen = {{"embed_tokens", torch::randn({40, 16}, torch::kDouble)},
                               {"lm_head", torch::randn({40, 16}, torch::kDouble)},
                               {"final_norm", torch::ones({16}, torch::kDouble)}};
  const SmallBatch b = small_batch(20, 9);
  const NamedTensors inputs = {{"input_ids", b.ids}, {"loss_mask", b.loss_mask}, {"position_ids", b.positions},
                               {"document_ids", b.documents}, {"hidden.1", torch::randn({2, 20, 16}, torch::kDouble)},
                               {"hidden.2", torch::randn({2, 20, 16}, torch::kDouble)}, {"hidden.3", torch::randn({2, 20, 16}, torch::kDouble)},
                               {"sample_seed", torch::tensor(int64_t{4})}};
  std::vector<NamedTensors> grads;
  std::vector<double> losses;
  // Plain (grouped attention, default group size); checkpointed (groups of
  // one block); embedding kept in host memory; dense attention; op-by-op
  // layers; groups of two blocks (many calls sharing context rows, whose
  // gradients row_gather.h sums), plain and checkpointed; the same with
  // attention keeping only the layer's rows (each call gathered again and
  // run again under autograd in backward; its rows as slices), plain and
  // checkpointed; and keeping rows with groups of one block over whole rows
  // (calls of eight groups: rows by index, too many runs for slices).
  for (int variant : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
    const bool checkpointing = variant == 1 || variant == 6 || variant == 8;
    config["activation_checkpointing"] = checkpointing;
    config["embedding_on_cpu"] = variant == 2;
    config["attention_group_blocks"] = variant == 1 || variant == 9 ? 1 : variant >= 5 ? 2 : 16;
    // Exact context ranges, ranges widened to multiples of 4 keys, and of 128 (the whole row here).
    config["attention_group_key_multiple"] = variant == 1 ? 1 : variant == 9 ? 128 : variant == 0 || variant >= 5 ? 4 : 128;
    config["attention"] = variant == 3 ? "dense" : "grouped";
    config["layer_ops"] = variant == 4 ? "aten" : "fused";
    config["attention_keeps"] = variant >= 7 ? "rows" : "calls";
    DrafterInstance drafter(record, config, {"cpu", "float64", 3});
    drafter.bind_target(target, frozen);
    const auto hidden = get(drafter.forward(inputs), "hidden");
    const auto weights = torch::linspace(-1, 1, hidden.numel(), torch::kDouble).view(hidden.sizes());
    const auto loss = (hidden * weights).sum() + hidden.pow(2).sum();
    loss.backward();
    losses.push_back(loss.item<double>());
    NamedTensors g;
    for (const auto& [name, p] : drafter.parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name << (checkpointing ? " (checkpointed)" : "");
      g.emplace_back(name, p.grad().clone());
    }
    grads.push_back(g);
  }
  for (int variant : {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    EXPECT_NEAR(losses[0], losses[variant], 1e-12 * std::abs(losses[0]));
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_TRUE(torch::allclose(grads[0][i].second, grads[variant][i].second, 1e-12, 1e-12)) << grads[0][i].first;
  }
}

// attention_keeps: auto keeps the layer's rows exactly where cuDNN's
// attention runs (its backward then recomputes nothing) and every call's
// q/k/v elsewhere; the model and the planner both ask keeps_rows.
TEST(DFlashDrafter, AttentionKeepsAutoKeepsRowsOnlyWhereCudnnRuns) {
  using dd::AttentionKeeps;
  EXPECT_TRUE(dd::keeps_rows(AttentionKeeps::kAuto, /*cudnn=*/true));
  EXPECT_FALSE(dd::keeps_rows(AttentionKeeps::kAuto, /*cudnn=*/false));
  for (bool cudnn : {false, true}) {
    EXPECT_TRUE(dd::keeps_rows(AttentionKeeps::kRows, cudnn));
    EXPECT_FALSE(dd::keeps_rows(AttentionKeeps::kCalls, cudnn));
  }
  EXPECT_EQ(dd::attention_keeps_named("auto"), AttentionKeeps::kAuto);
  EXPECT_EQ(dd::attention_keeps_named("rows"), AttentionKeeps::kRows);
  EXPECT_EQ(dd::attention_keeps_named("calls"), AttentionKeeps::kCalls);
  EXPECT_THROW(dd::attention_keeps_named("row"), std::invalid_argument);
}

// On a GPU (bf16) grouped attention (the fused kernels, per group; keeping
// every call's q, k and v or only the layer's rows) must give the dense
// path's outputs and gradients within bf16 noise. Keeping rows on cuDNN
// runs its backward by hand, with the arguments ATen's autograd passes.
TEST(DFlashDrafter, GroupedAttentionOnTheGpuMatchesTheDenseMask) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  const PluginRecord& record = registry.find(DFLASH_KIND_DRAFTER, "dflash");
  const dd::testing::GpuTarget gpu = dd::testing::small_gpu_target(12);
  const nlohmann::json& target = gpu.info;
  const NamedTensors& frozen = gpu.frozen;
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const SmallBatch b = small_batch(48, 13);
  NamedTensors inputs = {{"input_ids", b.ids}, {"loss_mask", b.loss_mask}, {"position_ids", b.positions},
                         {"document_ids", b.documents}, {"sample_seed", torch::tensor(int64_t{6})}};
  for (int64_t id : {1, 5}) inputs.emplace_back("hidden." + std::to_string(id), torch::randn({2, 48, 64}, cuda));
  std::vector<torch::Tensor> outputs;
  std::vector<NamedTensors> grads;
  // grouped through cuDNN (where it runs), keeping calls and keeping rows;
  // grouped through SDPA, keeping rows; dense through SDPA (the reference, last).
  struct Variant {
    const char *attention, *kernel, *keeps;
  };
  const std::vector<Variant> variants = {
      {"grouped", "auto", "calls"}, {"grouped", "auto", "rows"}, {"grouped", "sdpa", "rows"}, {"dense", "sdpa", "calls"}};
  for (const auto& [attention, kernel, keeps] : variants) {
    const nlohmann::json config = {{"num_layers", 2}, {"num_attention_heads", 0}, {"num_key_value_heads", 0},
                                   {"head_dim", 0}, {"intermediate_size", 0}, {"block_size", 4}, {"max_anchors", 6},
                                   {"gamma", 0.0}, {"mask_token_id", -1}, {"target_layer_ids", {1, 5}}, {"init_std", 0.1},
                                   {"rope_theta", 0.0}, {"activation_checkpointing", true}, {"attention", attention},
                                   {"attention_group_blocks", 2}, {"attention_group_key_multiple", 4}, {"attention_kernel", kernel},
                                   {"attention_keeps", keeps}};
    DrafterInstance drafter(record, config, {"cuda:0", "bfloat16", 3});
    drafter.bind_target(target, frozen);
    const auto hidden = get(drafter.forward(inputs), "hidden");
    projected_sum(hidden).backward();
    outputs.push_back(hidden.to(torch::kCPU, torch::kFloat));
    NamedTensors g;
    for (const auto& [name, p] : drafter.parameters()) g.emplace_back(name, p.grad().to(torch::kCPU, torch::kFloat));
    grads.push_back(g);
  }
  // Keeping rows runs through cuDNN's backward by hand only where that agrees
  // with SDPA (else it keeps calls): it must, here, or the variant above
  // tests the fallback.
  if (dd::cudnn_attention_works(cuda, 4, 2, 16))
    EXPECT_TRUE(dd::cudnn_attention_backward_by_hand_works(cuda, 4, 2, 16));
  const size_t reference = variants.size() - 1;
  for (size_t variant = 0; variant < reference; ++variant) {
    SCOPED_TRACE(std::string(variants[variant].attention) + " via " + variants[variant].kernel + ", keeping " +
                 variants[variant].keeps);
    const double scale = outputs[reference].abs().max().item<double>();
    EXPECT_LE((outputs[variant] - outputs[reference]).abs().max().item<double>(), 3e-2 * scale);
    for (size_t i = 0; i < grads[reference].size(); ++i) {
      const double gscale = grads[reference][i].second.abs().max().item<double>();
      EXPECT_LE((grads[variant][i].second - grads[reference][i].second).abs().max().item<double>(), 5e-2 * gscale + 1e-6)
          << grads[reference][i].first;
    }
  }
}

// attention: blocks by its ATen reference on the CPU, in fp64: the layers'
// hidden states and every parameter's gradient equal the dense mask's to
// rounding, with and without activation checkpointing, for a layout with
// prefix calls and remainders, one without prefixes and one nearly all
// prefix. This holds the composition the GPU runs (the prefixes' and the
// entries' gradients each from the merged output and log-sum-exp; the
// layout; the plan through the checkpointed layer) to exact arithmetic.
TEST(DFlashDrafter, BlockAttentionLayersMatchTheDenseMaskOnTheCpu) {
  const dd::DrafterShape shape = dd::testing::tiny_cpu_shape();
  const int64_t s = 120, bs = 16;
  const SmallBatch b = small_batch(s, 14);
  auto anchors = dd::sample_anchors(b.loss_mask, b.documents, 6, 8);
  anchors[1][5] = -1;  // a padding block
  const int64_t q_len = anchors.size(1) * bs;
  torch::manual_seed(6);
  const auto features = torch::randn({2, s, 32}, torch::kDouble);
  const auto slots = torch::randn({2, q_len, 16}, torch::kDouble);
  const auto context_positions = torch::arange(s, torch::kLong).expand({2, s});
  const auto slot_positions = torch::arange(q_len, torch::kLong).expand({2, q_len});
  for (const auto& [group_blocks, key_multiple] : std::vector<std::pair<int64_t, int64_t>>{{2, 8}, {2, 1000}, {1000, 1}})
    for (bool checkpointing : {false, true}) {
      SCOPED_TRACE(std::string(checkpointing ? "checkpointed" : "plain") + ", group_blocks " + std::to_string(group_blocks) +
                   ", key_multiple " + std::to_string(key_multiple));
      std::vector<torch::Tensor> outputs;
      std::vector<std::vector<torch::Tensor>> grads;
      for (bool blocks : {true, false}) {  // the dense mask last
        dd::DFlashModel model(shape, 7, 0.3, torch::kDouble, torch::kCPU);
        model.set_activation_checkpointing(checkpointing);
        const dd::BlockMasks masks{anchors, b.documents, bs, blocks ? group_blocks : 0, key_multiple, blocks};
        const auto hidden = model.forward(features, context_positions, slots, slot_positions, masks);
        projected_sum(hidden).backward();
        outputs.push_back(hidden.detach());
        std::vector<torch::Tensor> g;
        for (const auto& [name, p] : model.parameters()) g.push_back(p.grad());
        grads.push_back(g);
      }
      EXPECT_LE((outputs[0] - outputs[1]).abs().max().item<double>(), 1e-10 * outputs[1].abs().max().item<double>());
      for (size_t i = 0; i < grads[1].size(); ++i)
        EXPECT_LE((grads[0][i] - grads[1][i]).abs().max().item<double>(), 1e-9 * grads[1][i].abs().max().item<double>() + 1e-14)
            << "parameter " << i;
    }
}

namespace {
// The attention of q/k/v rows [R, heads or kv, d] under the dense mask, in
// fp32 (the reference for the block kernel): [B·Q, heads, d].
torch::Tensor dense_attention_rows(const torch::Tensor& q_rows, const torch::Tensor& k_rows, const torch::Tensor& v_rows,
                                   const torch::Tensor& mask, int64_t rows) {
  const int64_t heads = q_rows.size(1), kv = k_rows.size(1), d = q_rows.size(2);
  const auto by_row = [&](const torch::Tensor& t, int64_t h) { return t.view({rows, -1, h, d}).transpose(1, 2); };
  const auto q = by_row(q_rows.to(torch::kFloat), heads);
  const auto k = by_row(k_rows.to(torch::kFloat), kv).repeat_interleave(heads / kv, 1);
  const auto v = by_row(v_rows.to(torch::kFloat), kv).repeat_interleave(heads / kv, 1);
  const auto bias = torch::zeros(mask.sizes(), q.options()).masked_fill(mask.to(q.device()).logical_not(), -INFINITY);
  const auto p = torch::softmax(torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d)) + bias.unsqueeze(1), -1);
  return torch::matmul(p, v).transpose(1, 2).reshape({-1, heads, d});
}
}  // namespace

// The block kernel (attention: blocks) on the GPU: each group's prefix
// through cuDNN, the rest through the kernel, merged; output and q/k/v
// gradients within bf16 noise of the dense mask's attention in fp32, for
// blocks of 16 and 32, with two documents and a padding block.
TEST(DFlashDrafter, BlockAttentionOnTheGpuMatchesTheDenseMask) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const int64_t heads = 8, kv = 2, d = 128, s = 300;
  if (!dflash::kernel_ops::available()) GTEST_SKIP() << "this build has no CUDA kernels";
  ASSERT_TRUE(dd::cudnn_attention_backward_by_hand_works(cuda, heads, kv, d));
  const SmallBatch b = small_batch(s, 9);
  for (int64_t bs : {16, 32})
    for (const auto& [group_blocks, key_multiple] : std::vector<std::pair<int64_t, int64_t>>{{3, 64}, {2, 16}}) {
      SCOPED_TRACE("block " + std::to_string(bs) + ", group_blocks " + std::to_string(group_blocks) + ", key_multiple " +
                   std::to_string(key_multiple));
      ASSERT_TRUE(dflash::kernel_ops::block_attention_fits(torch::empty({1}, cuda), heads, kv, d, bs));
      auto anchors = dd::sample_anchors(b.loss_mask, b.documents, 10, 5);
      anchors[1][9] = -1;  // a padding block
      const int64_t q_len = anchors.size(1) * bs;
      const dd::BlockKernelLayout layout = dd::block_kernel_layout(anchors, b.documents, bs, group_blocks, key_multiple);
      ASSERT_FALSE(layout.prefixes.empty());
      const dd::BlockKernelTables tables = dd::block_kernel_tables(layout, torch::kCUDA);
      torch::manual_seed(bs + group_blocks);
      const auto q = torch::randn({2 * q_len, heads, d}, cuda).requires_grad_(true);
      const auto k = torch::randn({2 * (s + q_len), kv, d}, cuda).requires_grad_(true);
      const auto v = torch::randn({2 * (s + q_len), kv, d}, cuda).requires_grad_(true);
      const auto grad_out = torch::randn({2 * q_len, heads, d}, cuda);
      const auto out = dd::prefix_block_attention(q, k, v, tables.prefixes, tables.blocks, tables.tiles);
      const auto got = torch::autograd::grad({out}, {q, k, v}, {grad_out});
      const auto qf = q.detach().to(torch::kFloat).requires_grad_(true), kf = k.detach().to(torch::kFloat).requires_grad_(true);
      const auto vf = v.detach().to(torch::kFloat).requires_grad_(true);
      const auto reference = dense_attention_rows(qf, kf, vf, dd::block_attention_mask(anchors, b.documents, bs), 2);
      const auto want = torch::autograd::grad({reference}, {qf, kf, vf}, {grad_out.to(torch::kFloat)});
      auto near = [](const torch::Tensor& x, const torch::Tensor& ref, const char* what) {
        const double scale = ref.abs().max().item<double>();
        EXPECT_LE((x.to(torch::kFloat) - ref).abs().max().item<double>(), 2e-2 * scale) << what;
      };
      near(out, reference, "out");
      near(got[0], want[0], "dq");
      near(got[1], want[1], "dk");
      near(got[2], want[2], "dv");
    }
}

// The drafter's layers with attention: blocks, and grouped (cuDNN) beside
// it, against the dense mask through SDPA: hidden states and every
// parameter's gradient within bf16 noise, with and without activation
// checkpointing, with prefix calls, without, and nearly all prefix. (Under
// the sum of squares of the normalised states, whose gradients are bf16
// rounding noise, blocks was 0.85–0.95 of the gradients' scale off on the
// GPU, and on the CPU in bf16 grouped is 0.1–0.3 off as well; under the
// projected sum both are about 1 % off on the CPU.)
TEST(DFlashDrafter, BlockAttentionLayersOnTheGpuMatchTheDenseMask) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!dflash::kernel_ops::available()) GTEST_SKIP() << "this build has no CUDA kernels";
  dd::DrafterShape shape;
  shape.layers = 2, shape.hidden = 256, shape.heads = 8, shape.kv_heads = 2, shape.head_dim = 128, shape.intermediate = 512;
  shape.feature_layers = 2, shape.target_hidden = 128;
  const int64_t s = 160, bs = 16;
  const SmallBatch b = small_batch(s, 12);
  auto anchors = dd::sample_anchors(b.loss_mask, b.documents, 8, 3);
  anchors[1][7] = -1;
  const int64_t q_len = anchors.size(1) * bs;
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::manual_seed(4);
  const auto features = torch::randn({2, s, 256}, cuda);
  const auto slots = torch::randn({2, q_len, 256}, cuda);
  const auto context_positions = torch::arange(s, torch::kLong).expand({2, s}).to(torch::kCUDA);
  const auto slot_positions = torch::arange(q_len, torch::kLong).expand({2, q_len}).to(torch::kCUDA);
  enum Path { kBlocks, kGrouped, kDense };
  for (const auto& [group_blocks, key_multiple] : std::vector<std::pair<int64_t, int64_t>>{{2, 32}, {2, 1000}, {1000, 1}})
    for (bool checkpointing : {false, true}) {
      SCOPED_TRACE(std::string(checkpointing ? "checkpointed" : "plain") + ", group_blocks " + std::to_string(group_blocks) +
                   ", key_multiple " + std::to_string(key_multiple));
      std::vector<torch::Tensor> outputs;
      std::vector<std::vector<torch::Tensor>> grads;
      for (Path path : {kBlocks, kGrouped, kDense}) {
        dd::DFlashModel model(shape, 7, 0.1, torch::kBFloat16, torch::kCUDA);
        model.set_activation_checkpointing(checkpointing);
        if (path == kDense) model.set_attention_kernel(dd::DFlashModel::AttentionKernel::kSdpa);
        const dd::BlockMasks masks{anchors, b.documents, bs, path == kDense ? 0 : group_blocks, key_multiple, path == kBlocks};
        const auto hidden = model.forward(features, context_positions, slots, slot_positions, masks);
        projected_sum(hidden).backward();
        outputs.push_back(hidden.to(torch::kFloat));
        std::vector<torch::Tensor> g;
        for (const auto& [name, p] : model.parameters()) g.push_back(p.grad().to(torch::kFloat));
        grads.push_back(g);
      }
      auto error = [](const torch::Tensor& x, const torch::Tensor& ref) { return (x - ref).abs().max().item<double>(); };
      const double scale = outputs[kDense].abs().max().item<double>();
      for (Path path : {kBlocks, kGrouped}) {
        SCOPED_TRACE(path == kBlocks ? "blocks" : "grouped");
        EXPECT_LE(error(outputs[path], outputs[kDense]), 3e-2 * scale);
        for (size_t i = 0; i < grads[kDense].size(); ++i) {
          const double gscale = grads[kDense][i].abs().max().item<double>();
          EXPECT_LE(error(grads[path][i], grads[kDense][i]), 5e-2 * gscale + 1e-6) << "parameter " << i;
        }
      }
    }
}

// On a GPU in bf16 the fused layer ops (the CUDA kernels and their
// backwards) must give the op-by-op chain's hidden states and gradients within
// bf16 noise (the tolerances of GroupedAttentionOnTheGpuMatchesTheDenseMask),
// with and without activation checkpointing; with the embedding in host
// memory, exactly what they give with it on the device.
TEST(DFlashDrafter, FusedLayerOpsOnTheGpuMatchTheOpByOpChain) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  const PluginRecord& record = registry.find(DFLASH_KIND_DRAFTER, "dflash");
  const dd::testing::GpuTarget gpu = dd::testing::small_gpu_target(12);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const SmallBatch b = small_batch(48, 17);
  NamedTensors inputs = {{"input_ids", b.ids}, {"loss_mask", b.loss_mask}, {"position_ids", b.positions},
                         {"document_ids", b.documents}, {"sample_seed", torch::tensor(int64_t{2})}};
  for (int64_t id : {1, 5}) inputs.emplace_back("hidden." + std::to_string(id), torch::randn({2, 48, 64}, cuda));
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "checkpointed" : "plain");
    std::vector<torch::Tensor> outputs;
    std::vector<NamedTensors> grads;
    // Fused with the embedding in host memory (only the distinct slot rows
    // travel), fused, and the op-by-op reference last.
    const std::vector<std::pair<const char*, bool>> variants = {{"fused", true}, {"fused", false}, {"aten", false}};
    for (const auto& [ops, embedding_on_cpu] : variants) {
      const nlohmann::json config = {{"num_layers", 2}, {"num_attention_heads", 0}, {"num_key_value_heads", 0},
                                     {"head_dim", 0}, {"intermediate_size", 0}, {"block_size", 4}, {"max_anchors", 6},
                                     {"gamma", 0.0}, {"mask_token_id", -1}, {"target_layer_ids", {1, 5}}, {"init_std", 0.1},
                                     {"rope_theta", 0.0}, {"activation_checkpointing", checkpointing},
                                     {"attention", "grouped"}, {"attention_group_blocks", 2},
                                     {"attention_group_key_multiple", 4}, {"layer_ops", ops},
                                     {"embedding_on_cpu", embedding_on_cpu}};
      DrafterInstance drafter(record, config, {"cuda:0", "bfloat16", 3});
      drafter.bind_target(gpu.info, gpu.frozen);
      const auto hidden = get(drafter.forward(inputs), "hidden");
      projected_sum(hidden).backward();
      outputs.push_back(hidden.to(torch::kCPU, torch::kFloat));
      NamedTensors g;
      for (const auto& [name, p] : drafter.parameters()) g.emplace_back(name, p.grad().to(torch::kCPU, torch::kFloat));
      grads.push_back(g);
    }
    // The embedding's placement changes no arithmetic: the same bits.
    EXPECT_TRUE(torch::equal(outputs[0], outputs[1]));
    for (size_t i = 0; i < grads[1].size(); ++i) EXPECT_TRUE(torch::equal(grads[0][i].second, grads[1][i].second)) << grads[1][i].first;
    const double scale = outputs[2].abs().max().item<double>();
    EXPECT_LE((outputs[1] - outputs[2]).abs().max().item<double>(), 3e-2 * scale);
    for (size_t i = 0; i < grads[2].size(); ++i) {
      const double gscale = grads[2][i].second.abs().max().item<double>();
      EXPECT_LE((grads[1][i].second - grads[2][i].second).abs().max().item<double>(), 5e-2 * gscale + 1e-6)
          << grads[2][i].first;
    }
  }
}

// Drafting computes each accepted position's keys and values once and runs
// one block against them: the same hidden states as the training forward
// shows the block at that anchor, with the context arriving in pieces.
TEST(DFlashDrafter, DraftingWithACachedContextMatchesTheTrainingForward) {
  const dd::DrafterShape shape = dd::testing::tiny_cpu_shape();
  const dd::DFlashModel model(shape, 5, 0.3, torch::kDouble, torch::kCPU);
  const int64_t s = 20, bs = 4;
  torch::manual_seed(21);
  const auto features = torch::randn({1, s, 32}, torch::kDouble);
  const auto anchors = torch::tensor({{3, 9, 15}}, torch::kLong);
  const auto slots = torch::randn({1, 3 * bs, 16}, torch::kDouble);
  const auto slot_positions = (anchors.repeat_interleave(bs, 1) + torch::arange(bs, torch::kLong).repeat({3}).unsqueeze(0));
  const dd::BlockMasks masks{anchors, torch::zeros({1, s}, torch::kLong), bs, 64};
  const auto trained = model.forward(features, torch::arange(s, torch::kLong).unsqueeze(0), slots, slot_positions, masks)[0];
  for (int64_t block = 0; block < 3; ++block) {
    const int64_t a = anchors[0][block].item<int64_t>();
    dd::DraftContext context;
    model.extend_context(context, features[0].narrow(0, 0, a / 2));
    model.extend_context(context, features[0].narrow(0, a / 2, a - a / 2));
    EXPECT_EQ(context.length, a);
    const auto drafted = model.draft(context, slots[0].narrow(0, block * bs, bs));
    EXPECT_TRUE(torch::allclose(drafted, trained.narrow(0, block * bs, bs), 1e-10, 1e-10)) << "block at anchor " << a;
  }
}

// The context's buffers grow by doubling (from 256 positions) and keep what
// they hold; the device-length variants (a graph's: the length read from a
// tensor, the cache written by index) compute exactly what the host-length
// path does. A block drafted at an anchor past the first growth still matches
// the training forward there.
TEST(DFlashDrafter, DraftingBuffersGrowAndTheDeviceLengthPathAgrees) {
  const dd::DrafterShape shape = dd::testing::tiny_cpu_shape();
  const dd::DFlashModel model(shape, 5, 0.3, torch::kDouble, torch::kCPU);
  const int64_t s = 300, bs = 4, anchor = 290;
  torch::manual_seed(22);
  const auto features = torch::randn({1, s, 32}, torch::kDouble);
  const auto slots = torch::randn({1, bs, 16}, torch::kDouble);
  const auto anchors = torch::tensor({{anchor}}, torch::kLong);
  const auto slot_positions = anchor + torch::arange(bs, torch::kLong).unsqueeze(0);
  const dd::BlockMasks masks{anchors, torch::zeros({1, s}, torch::kLong), bs, 0};
  const auto trained = model.forward(features, torch::arange(s, torch::kLong).unsqueeze(0), slots, slot_positions, masks)[0];

  dd::DraftContext grown;
  std::set<uint64_t> generations;
  for (int64_t from = 0; from < anchor; from += 100) {
    model.extend_context(grown, features[0].narrow(0, from, std::min<int64_t>(100, anchor - from)));
    generations.insert(grown.generation);
  }
  EXPECT_EQ(grown.length, anchor);
  EXPECT_EQ(grown.capacity, 512) << "256, then doubled once past it";
  EXPECT_EQ(generations.size(), 2u) << "the buffers moved once";
  const auto drafted = model.draft(grown, slots[0]);
  EXPECT_TRUE(torch::allclose(drafted, trained, 1e-10, 1e-10));

  // The same context written at lengths held in tensors, as a captured graph does.
  dd::DraftContext at_device;
  model.reserve(at_device, anchor + bs);
  for (int64_t from = 0; from < anchor; from += 7) {
    const int64_t n = std::min<int64_t>(7, anchor - from);
    model.extend_context_at(at_device, features[0].narrow(0, from, n), torch::tensor({from}, torch::kLong));
    at_device.length += n;
  }
  for (int64_t layer = 0; layer < shape.layers; ++layer) {
    // (other chunk sizes: the GEMMs may round differently in the last bit)
    EXPECT_TRUE(torch::allclose(at_device.keys[layer].narrow(0, 0, anchor), grown.keys[layer].narrow(0, 0, anchor), 1e-12, 1e-12));
    EXPECT_TRUE(torch::allclose(at_device.values[layer].narrow(0, 0, anchor), grown.values[layer].narrow(0, 0, anchor), 1e-12, 1e-12));
  }
  EXPECT_FALSE(model.flash_drafting()) << "flash drafting is for CUDA in bf16/fp16";
  // The block's keys are scratch past the context: a second proposal at the same length gives the same states.
  const auto again = model.draft(at_device, slots[0]);
  EXPECT_TRUE(torch::allclose(again, drafted, 1e-10, 1e-10));
  EXPECT_TRUE(torch::equal(model.draft(at_device, slots[0]), again));
}

// On a GPU in bf16: drafting with the length on the device (flash attention
// over the context's variable length, what the plugin captures as a CUDA
// graph) against the host-length path (SDPA over the narrowed cache), and the
// captured graph's replay against the same call run eagerly.
TEST(DFlashDrafter, FlashDraftingAndItsCudaGraphMatchTheHostPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const dd::DrafterShape shape = dd::testing::small_gpu_shape();
  const torch::Device cuda("cuda:0");
  dd::DFlashModel model(shape, 5, 0.05, torch::kBFloat16, cuda);
  if (!model.flash_drafting()) GTEST_SKIP() << "this LibTorch has no flash drafting";
  model.set_drafting_kernels(false);  // the ATen path (the fused one: drafting_fast_path_test.cpp)
  const int64_t context = 37, bs = 8;
  torch::manual_seed(23);
  const auto features = torch::randn({context + 5, 64}, torch::TensorOptions().dtype(torch::kBFloat16).device(cuda));
  const auto slots = torch::randn({bs, 64}, torch::TensorOptions().dtype(torch::kBFloat16).device(cuda));
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(cuda);

  dd::DraftContext host_length;
  model.extend_context(host_length, features.narrow(0, 0, context));
  const auto expected = model.draft(host_length, slots).to(torch::kFloat);

  dd::DraftContext device_length;
  model.reserve(device_length, context + 5 + bs);
  model.extend_context_at(device_length, features.narrow(0, 0, context), torch::zeros({1}, longs));
  device_length.length = context;
  const auto base = torch::full({1}, context, longs);
  const auto flash = model.draft_at(device_length, slots, base).to(torch::kFloat);
  EXPECT_LE((flash - expected).abs().max().item<double>(), 3e-2 * expected.abs().max().item<double>());

  // Captured, then replayed after the context grew by 5 (the length refilled in place).
  dflash::decode_support::CudaGraphPool pool(cuda);
  torch::Tensor out;
  std::string error;
  const auto graph = pool.capture([&] { out = model.draft_at(device_length, slots, base); }, error);
  if (!dflash::decode_support::kCudaGraphs) GTEST_SKIP() << error;
  ASSERT_TRUE(graph) << error;
  model.extend_context_at(device_length, features.narrow(0, context, 5), base);
  device_length.length = context + 5;
  base.fill_(context + 5);
  graph->replay();
  const auto replayed = out.clone();
  const auto eager = model.draft_at(device_length, slots, base);
  EXPECT_TRUE(torch::equal(replayed, eager)) << "a replay computes what the same call computes eagerly";
  model.extend_context(host_length, features.narrow(0, context, 5));
  const auto host = model.draft(host_length, slots).to(torch::kFloat);
  EXPECT_LE((replayed.to(torch::kFloat) - host).abs().max().item<double>(), 3e-2 * host.abs().max().item<double>());
}

TEST(DFlashDrafter, BadTargetsAndOrderAreRefused) {
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  const PluginRecord& record = registry.find(DFLASH_KIND_DRAFTER, "dflash");
  const nlohmann::json base = {{"num_layers", 2}, {"num_attention_heads", 0}, {"num_key_value_heads", 0}, {"head_dim", 0},
                               {"intermediate_size", 0}, {"block_size", 4}, {"max_anchors", 3}, {"gamma", 0.0},
                               {"mask_token_id", -1}, {"target_layer_ids", nlohmann::json::array()}, {"init_std", 0.02},
                               {"rope_theta", 0.0}, {"activation_checkpointing", false}};
  const nlohmann::json target = {{"num_layers", 6}, {"hidden_size", 16}, {"vocab_size", 40}, {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2}, {"head_dim", 4}};
  const NamedTensors frozen = {{"embed_tokens", torch::randn({40, 16})}, {"lm_head", torch::randn({40, 16})},
                               {"final_norm", torch::ones({16})}};
  {
    DrafterInstance unbound(record, base, {"cpu", "float32", 1});
    try {
      unbound.parameters();
      FAIL();
    } catch (const PluginCallError& e) {
      EXPECT_CONTAINS(e.what(), "bind_target must come first");
    }
  }
  nlohmann::json far = base;
  far["target_layer_ids"] = {1, 9};
  DrafterInstance bad_layers(record, far, {"cpu", "float32", 1});
  try {
    bad_layers.bind_target(target, frozen);
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "drafter.target_layer_ids: 9 is not a layer of the target (it has 6)");
  }
  nlohmann::json bad_mask = base;
  bad_mask["mask_token_id"] = 40;
  DrafterInstance mask(record, bad_mask, {"cpu", "float32", 1});
  try {
    mask.bind_target(target, frozen);
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "drafter.mask_token_id 40 is outside the target's vocabulary of 40");
  }
}

}  // namespace
