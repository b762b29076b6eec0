// DDTree verification (issue 41) on the shipped quickstart target, on the
// CPU: a tree's rows against each node's path decoded alone, the accepted
// path's cache (its rows compacted) against plain decoding, the rules of a
// pending tree, and speculative decoding with trees against the target's
// own greedy decoding (lossless) at several node budgets, and eval's arms
// (the chain and tree budgets in one run) against each arm evaluated alone.
#include "eval/evaluation.h"
#include "plugin/drafter_facts.h"
#include "plugin/registry.h"
#include "train/frozen_weights.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace dflash;
using host::DrafterInstance;
using host::NamedTensors;
using host::TargetModelInstance;

const std::string kTarget = DFLASH_CONFIGS_DIR "/quickstart/target";
const std::string kHeldout = DFLASH_CONFIGS_DIR "/quickstart/data/heldout.jsonl";

host::PluginRegistry& registry() {
  static host::PluginRegistry r = [] {
    host::PluginRegistry reg;
    reg.add_directory(DFLASH_INTREE_PLUGIN_DIR);
    return reg;
  }();
  return r;
}

std::unique_ptr<TargetModelInstance> quickstart_target() {
  const auto& record = registry().find(DFLASH_KIND_TARGET_MODEL, "hf_decoder");
  const nlohmann::json config = {{"path", kTarget}, {"dtype", "auto"}, {"feature_layers", 2}, {"kernels", "auto"},
                                 {"streams", 2}, {"attention", "auto"}};
  return std::make_unique<TargetModelInstance>(record, config, host::InstanceOptions{"cpu", "float32", 0});
}

std::unique_ptr<DrafterInstance> dflash_drafter(const TargetModelInstance& target, int64_t block_size) {
  const auto& record = registry().find(DFLASH_KIND_DRAFTER, "dflash");
  const nlohmann::json config = {{"num_layers", 2}, {"num_attention_heads", 0}, {"num_key_value_heads", 0}, {"head_dim", 0},
                                 {"intermediate_size", 0}, {"block_size", block_size}, {"max_anchors", 48}, {"gamma", 0.0},
                                 {"mask_token_id", 259}, {"target_layer_ids", nlohmann::json::array()}, {"init_std", 0.02},
                                 {"rope_theta", 0.0}, {"attention", "grouped"}, {"attention_group_blocks", 64},
                                 {"attention_group_key_multiple", 128}, {"attention_kernel", "auto"},
                                 {"embedding_on_cpu", false}, {"activation_checkpointing", false}};
  auto d = std::make_unique<DrafterInstance>(record, config, host::InstanceOptions{"cpu", "float32", 7});
  d->bind_target(target.describe(), host::place_frozen_weights(target.frozen_weights(), "hf_decoder", torch::kCPU, torch::kFloat));
  return d;
}

const at::Tensor& get(const NamedTensors& out, const std::string& name) {
  for (const auto& [key, t] : out)
    if (key == name) return t;
  throw std::runtime_error("no " + name);
}

std::vector<std::vector<int64_t>> heldout_prompts(size_t count, int64_t length) {
  eval::EvalSettings s;
  s.prompts_file = kHeldout;
  s.prompt_tokens = 200;
  s.max_prompts = static_cast<int64_t>(count);
  std::vector<std::vector<int64_t>> out;
  for (const auto& p : eval::read_prompts(s, nlohmann::json{{"vocab_size", 260}})) {
    auto ids = p.ids;
    ids.resize(static_cast<size_t>(length));
    out.push_back(ids);
  }
  return out;
}

// eval over the first `prompts` held-out prompts, `new_tokens` each.
eval::EvalSettings heldout_eval(int64_t prompts, int64_t new_tokens) {
  eval::EvalSettings s;
  s.prompts_file = kHeldout;
  s.max_prompts = prompts;
  s.max_new_tokens = new_tokens;
  return s;
}

at::Tensor ids(const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong); }

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

// The target's greedy continuation of `prompt`, n tokens.
std::vector<int64_t> greedy(const TargetModelInstance& target, const std::vector<int64_t>& prompt, int64_t n) {
  eval::DecodeLimits limits;
  limits.max_new_tokens = n;
  return eval::greedy_decode(target, prompt, limits).tokens;
}

// A tree below the newest token g0 (node 0) whose greedy path g1 g2 g3 sits
// at nodes 0 → 4 → 6 → 7, with decoys before each (so the path is not in
// node order: accepting it moves cache rows), and a fourth-level decoy.
struct Fixture {
  std::vector<int64_t> tokens, parents, path;
};
Fixture tree_around(const std::vector<int64_t>& g) {
  auto other = [](int64_t t, int64_t k) { return (t + 17 * k) % 256; };  // a token that is not t
  Fixture f;
  // node: 0 g0 | 1 decoy(g1) | 2 decoy(g1) below 1 | 3 decoy(g1) | 4 g1 | 5 decoy(g2) below 4 | 6 g2 below 4 | 7 g3 below 6 | 8 decoy below 7
  f.tokens = {g[0], other(g[1], 1), other(g[2], 2), other(g[1], 3), g[1], other(g[2], 4), g[2], g[3], other(g[4], 5)};
  f.parents = {-1, 0, 1, 0, 0, 4, 4, 6, 7};
  f.path = {0, 4, 6, 7};
  return f;
}

TEST(TreeVerification, EachNodeGetsWhatItsPathDecodedAloneGets) {
  auto target = quickstart_target();
  ASSERT_TRUE(target->can_verify_tree());
  const auto prompt = heldout_prompts(1, 30)[0];
  const auto g = greedy(*target, prompt, 6);
  const Fixture f = tree_around(g);
  const int64_t session = target->decode_begin(64);
  target->decode_extend(session, ids(prompt), {}, false);
  const NamedTensors tree = target->decode_verify_tree(session, ids(f.tokens), f.parents, {1, 3}, true);
  const at::Tensor logits = get(tree, "logits"), hidden = get(tree, "hidden.3");
  ASSERT_EQ(logits.sizes(), (at::IntArrayRef{9, 260}));
  ASSERT_EQ(hidden.size(0), 9);
  const double scale = logits.abs().max().item<double>();
  for (int64_t i = 0; i < 9; ++i) {
    std::vector<int64_t> path;
    for (int64_t a = i; a >= 0; a = f.parents[static_cast<size_t>(a)]) path.insert(path.begin(), f.tokens[static_cast<size_t>(a)]);
    const int64_t alone = target->decode_begin(64);
    target->decode_extend(alone, ids(prompt), {}, false);
    const NamedTensors out = target->decode_extend(alone, ids(path), {3}, true);
    target->decode_end(alone);
    const int64_t last = static_cast<int64_t>(path.size()) - 1;
    EXPECT_LE((get(out, "logits")[last] - logits[i]).abs().max().item<double>(), 1e-4 * scale) << "node " << i;
    EXPECT_LE((get(out, "hidden.3")[last] - hidden[i]).abs().max().item<double>(), 1e-4 * hidden.abs().max().item<double>())
        << "node " << i;
  }
  // The greedy choices walk the path 0 → 4 → 6 → 7 (the decoys are never the target's choice).
  const at::Tensor choice = logits.argmax(-1);
  EXPECT_EQ(choice[0].item<int64_t>(), g[1]);
  EXPECT_EQ(choice[4].item<int64_t>(), g[2]);
  EXPECT_EQ(choice[6].item<int64_t>(), g[3]);
  EXPECT_EQ(choice[7].item<int64_t>(), g[4]);
  target->decode_end(session);
}

TEST(TreeVerification, TheAcceptedPathsCacheIsWhatDecodingItWouldHaveLeft) {
  auto target = quickstart_target();
  const auto prompt = heldout_prompts(1, 30)[0];
  const auto g = greedy(*target, prompt, 12);
  const Fixture f = tree_around(g);
  const int64_t session = target->decode_begin(64);
  target->decode_extend(session, ids(prompt), {}, false);
  target->decode_verify_tree(session, ids(f.tokens), f.parents, {}, true);
  target->decode_accept_path(session, f.path);  // rows 0, 4, 6, 7 of the tree move to 0..3
  // From here plain decoding must continue the greedy sequence exactly: g4 is next.
  std::vector<int64_t> continued;
  int64_t next = g[4];
  for (int k = 0; k < 6; ++k) {
    continued.push_back(next);
    const at::Tensor logits = get(target->decode_extend(session, ids({next}), {}, true), "logits");
    next = logits[-1].argmax().item<int64_t>();
  }
  EXPECT_EQ(continued, std::vector<int64_t>(g.begin() + 4, g.begin() + 10));
  // Accepting nothing keeps the session as it was before the tree.
  target->decode_verify_tree(session, ids(f.tokens), f.parents, {}, false);
  target->decode_accept_path(session, {});
  const at::Tensor after = get(target->decode_extend(session, ids({next}), {}, true), "logits");
  EXPECT_EQ(after[-1].argmax().item<int64_t>(), g[11]);
  target->decode_end(session);
}

TEST(TreeVerification, APendingTreeAndBadPathsAreRefusedByName) {
  auto target = quickstart_target();
  const auto prompt = heldout_prompts(1, 20)[0];
  const int64_t session = target->decode_begin(40);
  target->decode_extend(session, ids(prompt), {}, false);
  EXPECT_NE(message_of([&] { target->decode_verify_tree(session, ids({1, 2}), {-1, 1}, {}, true); }).find("node 1's parent 1 is not in [-1, 1)"),
            std::string::npos);
  EXPECT_NE(message_of([&] { target->decode_accept_path(session, {0}); }).find("has no verified draft tree"), std::string::npos);
  // Deeper than the session's max_length: 20 cached + a path of 21.
  std::vector<int64_t> chain_tokens(21, 5), chain_parents;
  for (int64_t i = 0; i < 21; ++i) chain_parents.push_back(i - 1);
  EXPECT_NE(message_of([&] { target->decode_verify_tree(session, ids(chain_tokens), chain_parents, {}, true); })
                .find("deepest path of 21 tokens would make 41, beyond the session's max_length 40"),
            std::string::npos);
  target->decode_verify_tree(session, ids({4, 5, 6}), {-1, 0, -1}, {}, true);
  EXPECT_NE(message_of([&] { target->decode_extend(session, ids({1}), {}, true); }).find("has a verified draft tree pending"),
            std::string::npos);
  EXPECT_NE(message_of([&] { target->decode_truncate(session, 3); }).find("has a verified draft tree pending"), std::string::npos);
  EXPECT_NE(message_of([&] { target->decode_accept_path(session, {1}); }).find("hangs below node 0, not below the last cached token"),
            std::string::npos);
  EXPECT_NE(message_of([&] { target->decode_accept_path(session, {0, 2}); }).find("hangs below node -1, not below node 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] { target->decode_accept_path(session, {0, 9}); }).find("outside the tree's 3 nodes"), std::string::npos);
  target->decode_accept_path(session, {2});  // a root that is not node 0: one row moves
  const int64_t length_after = 21;
  EXPECT_NO_THROW(target->decode_truncate(session, length_after));
  EXPECT_THROW(target->decode_truncate(session, length_after + 1), std::exception);
  target->decode_end(session);
}

// Lossless: with trees of any budget, speculative decoding emits exactly the
// target's greedy tokens; the random drafter's top candidates cover enough
// of the 260-token vocabulary that paths are accepted (paths several nodes
// deep are the target-level tests' above: this drafter's near-uniform
// candidates make wide, shallow trees).
TEST(TreeVerification, SpeculativeDecodingWithTreesEmitsExactlyTheGreedyTokens) {
  auto target = quickstart_target();
  const auto prompts = heldout_prompts(3, 40);
  eval::DecodeLimits limits;
  limits.max_new_tokens = 40;
  limits.eos_token_ids = {257};
  auto d = dflash_drafter(*target, 8);
  ASSERT_TRUE(d->can_draft_topk());
  const auto layers = d->export_config()->at("target_layer_ids").get<std::vector<int64_t>>();
  int64_t accepted = 0;
  for (int64_t nodes : {1, 4, 16, 64, 128}) {
    for (const auto& prompt : prompts) {
      SCOPED_TRACE(std::to_string(nodes) + " nodes");
      const auto expected = eval::greedy_decode(*target, prompt, limits);
      const auto spec = eval::speculative_decode(*target, *d, prompt, limits, 8, layers, nullptr,
                                                 {eval::Verification::Kind::kTree, nodes});
      EXPECT_EQ(spec.tokens, expected.tokens);
      EXPECT_EQ(spec.stop_reason, expected.stop_reason);
      EXPECT_EQ(spec.target_passes, 1 + static_cast<int64_t>(spec.step_tokens.size()));
      for (size_t k = 0; k < spec.step_tokens.size(); ++k) {
        EXPECT_LE(spec.step_proposed[k], 7);
        EXPECT_LE(spec.step_accepted[k], spec.step_proposed[k]);
        if (nodes == 1) EXPECT_LE(spec.step_accepted[k], 1);
        accepted += spec.step_accepted[k];
      }
    }
  }
  EXPECT_GT(accepted, 20) << "paths were accepted, so the cache compaction ran";
}

TEST(TreeVerification, BudgetsBeyondTheContextAndPluginsWithoutTreesAreRefusedByName) {
  auto target = quickstart_target();
  auto d = dflash_drafter(*target, 8);
  const auto prompts = heldout_prompts(1, 20);
  eval::EvalSettings settings;
  settings.max_new_tokens = 8;
  settings.max_length = 200;
  settings.baseline = false;
  settings.warmup = false;
  settings.verification = {eval::Verification::Kind::kTree, 200};
  std::vector<eval::Prompt> prompt_list = {eval::Prompt{prompts[0], 1}};
  const std::string too_big = message_of([&] {
    eval::evaluate(*target, *d, host::drafter_facts(*d), prompt_list, settings, target->describe());
  });
  EXPECT_NE(too_big.find("--tree-nodes 200: a tree of that many nodes and the newest token is beyond the target's context of 200 "
                         "tokens"),
            std::string::npos)
      << too_big;
  settings.verification.tree_nodes = 199;  // 199 nodes and the newest token: exactly the context
  EXPECT_NO_THROW(eval::evaluate(*target, *d, host::drafter_facts(*d), prompt_list, settings, target->describe()));

  // Prompt lookup proposes a chain only: asked for a tree, it is named.
  const auto& record = registry().find(DFLASH_KIND_DRAFTER, "prompt_lookup");
  DrafterInstance lookup(record, {{"block_size", 4}, {"max_ngram", 3}, {"min_ngram", 1}}, host::InstanceOptions{"cpu", "float32", 0});
  lookup.bind_target(target->describe(),
                     host::place_frozen_weights(target->frozen_weights(), "hf_decoder", torch::kCPU, torch::kFloat));
  EXPECT_FALSE(lookup.can_draft_topk());
  eval::DecodeLimits limits;
  limits.max_new_tokens = 4;
  const std::string no_topk = message_of([&] {
    eval::speculative_decode(*target, lookup, prompts[0], limits, 4, {}, nullptr, {eval::Verification::Kind::kTree, 8});
  });
  EXPECT_NE(no_topk.find("prompt_lookup"), std::string::npos) << no_topk;
  EXPECT_NE(no_topk.find("does not propose a tree's candidates (ABI 1.4's draft_propose_topk); use --verify chain"),
            std::string::npos)
      << no_topk;
  EXPECT_NE(message_of([&] {
              eval::speculative_decode(*target, *d, prompts[0], limits, 8, {}, nullptr, {eval::Verification::Kind::kTree, 0});
            }).find("--tree-nodes is 0; a draft tree needs at least 1 node"),
            std::string::npos);
}

// One run, several arms (a DDTree budget sweep beside the chain): each arm
// gives what its own evaluation gives, and the target alone decodes each
// prompt once for all of them.
TEST(EvaluateArms, EachArmMatchesItsOwnEvaluationAgainstOneBaseline) {
  auto target = quickstart_target();
  auto d = dflash_drafter(*target, 8);
  d->set_training(false);
  const auto info = target->describe();
  eval::EvalSettings s = heldout_eval(3, 24);
  const auto prompts = eval::read_prompts(s, info);
  const std::vector<eval::Verification> arms = {
      {}, {eval::Verification::Kind::kTree, 4}, {eval::Verification::Kind::kTree, 16}};
  const std::vector<nlohmann::json> reports = eval::evaluate_arms(*target, *d, host::drafter_facts(*d), prompts, s, arms, info);
  ASSERT_EQ(reports.size(), arms.size());
  for (size_t a = 0; a < arms.size(); ++a) {
    SCOPED_TRACE(eval::arm_label(arms[a]));
    s.verification = arms[a];
    const nlohmann::json alone = eval::evaluate(*target, *d, host::drafter_facts(*d), prompts, s, info);
    const nlohmann::json& report = reports[a];
    EXPECT_EQ(report.at("verify"), alone.at("verify"));
    EXPECT_EQ(report.at("tree_nodes"), alone.at("tree_nodes"));
    EXPECT_EQ(report.at("block_size"), alone.at("block_size"));
    EXPECT_EQ(report.at("warmup_prompts"), 1);
    EXPECT_EQ(report.at("tau_mean"), alone.at("tau_mean"));
    EXPECT_EQ(report.at("tau_histogram"), alone.at("tau_histogram"));
    EXPECT_EQ(report.at("acceptance_by_position"), alone.at("acceptance_by_position"));
    ASSERT_EQ(report.at("per_prompt").size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const nlohmann::json &row = report.at("per_prompt")[i], &row_alone = alone.at("per_prompt")[i];
      EXPECT_EQ(row.at("tokens"), row_alone.at("tokens")) << "prompt " << i;
      EXPECT_EQ(row.at("target_passes"), row_alone.at("target_passes")) << "prompt " << i;
      EXPECT_EQ(row.at("greedy_seconds"), reports[0].at("per_prompt")[i].at("greedy_seconds"))
          << "prompt " << i << ": one decoding by the target alone serves every arm";
    }
    EXPECT_TRUE(report.at("lossless").get<bool>()) << eval::format_report(report);
    EXPECT_EQ(report.at("greedy_tokens_per_s"), reports[0].at("greedy_tokens_per_s")) << "one baseline for every arm";
    EXPECT_DOUBLE_EQ(report.at("speedup").get<double>(), report.at("speculative_tokens_per_s").get<double>() /
                                                             report.at("greedy_tokens_per_s").get<double>());
  }
  // The comparison: one entry per arm, ratios to the first.
  const nlohmann::json comparison = eval::compare_arms(reports);
  ASSERT_EQ(comparison.size(), arms.size());
  const std::string table = eval::format_comparison(comparison);
  for (size_t a = 0; a < arms.size(); ++a) {
    const nlohmann::json& entry = comparison[a];
    EXPECT_EQ(entry.at("arm"), eval::arm_label(arms[a]));
    EXPECT_DOUBLE_EQ(entry.at("tau_ratio_to_first").get<double>(),
                     reports[a].at("tau_mean").get<double>() / reports[0].at("tau_mean").get<double>());
    EXPECT_DOUBLE_EQ(entry.at("speed_ratio_to_first").get<double>(),
                     reports[a].at("speculative_tokens_per_s").get<double>() /
                         reports[0].at("speculative_tokens_per_s").get<double>());
    EXPECT_EQ(entry.at("speedup"), reports[a].at("speedup"));
    EXPECT_TRUE(entry.at("lossless").get<bool>());
    EXPECT_NE(table.find("\n  " + eval::arm_label(arms[a]) + " "), std::string::npos) << table;
  }
  EXPECT_NE(table.find("speed-up  lossless"), std::string::npos) << table;
}

// Without the target alone: no speed-up and no lossless check, still a
// report per arm; --draft-tokens sets the chain's length, not the trees'
// depth; every tree's budget is checked before anything is decoded.
TEST(EvaluateArms, WithoutABaselineEachArmStillGetsItsReport) {
  auto target = quickstart_target();
  auto d = dflash_drafter(*target, 8);
  d->set_training(false);
  const auto info = target->describe();
  eval::EvalSettings s = heldout_eval(2, 16);
  s.baseline = false;
  s.warmup = false;
  s.draft_tokens = 3;
  const auto prompts = eval::read_prompts(s, info);
  const std::vector<eval::Verification> arms = {{}, {eval::Verification::Kind::kTree, 2}, {eval::Verification::Kind::kTree, 8}};
  const std::vector<nlohmann::json> reports = eval::evaluate_arms(*target, *d, host::drafter_facts(*d), prompts, s, arms, info);
  ASSERT_EQ(reports.size(), arms.size());
  const int64_t drafter_block = host::drafter_facts(*d).block_size;
  for (size_t a = 0; a < arms.size(); ++a) {
    SCOPED_TRACE(eval::arm_label(arms[a]));
    const nlohmann::json& report = reports[a];
    for (const char* key : {"speedup", "lossless", "greedy_tokens_per_s", "identical_prompts"})
      EXPECT_FALSE(report.contains(key)) << key;
    EXPECT_EQ(report.at("warmup_prompts"), 0);
    EXPECT_EQ(report.at("block_size"), a == 0 ? s.draft_tokens + 1 : drafter_block);
    ASSERT_EQ(report.at("per_prompt").size(), prompts.size());
    for (const auto& row : report.at("per_prompt")) EXPECT_FALSE(row.contains("identical_to_greedy"));
    EXPECT_EQ(eval::verification_of(report).tree_nodes, arms[a].tree_nodes);
  }
  const nlohmann::json comparison = eval::compare_arms(reports);
  ASSERT_EQ(comparison.size(), arms.size());
  for (const auto& entry : comparison) {
    EXPECT_FALSE(entry.contains("speedup"));
    EXPECT_FALSE(entry.contains("lossless"));
  }
  EXPECT_EQ(eval::format_comparison(comparison).find("lossless"), std::string::npos);

  // A last arm too big for the context refuses the run, by its budget.
  s.max_length = 100;
  const std::string too_big = message_of([&] {
    eval::evaluate_arms(*target, *d, host::drafter_facts(*d), prompts, s, {{}, {eval::Verification::Kind::kTree, 100}}, info);
  });
  EXPECT_NE(too_big.find("--tree-nodes 100: a tree of that many nodes and the newest token is beyond the target's context of 100"),
            std::string::npos)
      << too_big;
}

}  // namespace
