// Decoding: the target's KV cache against its full forward, the DFlash
// drafter's cached drafting against its training forward, the prompt-lookup
// baseline's proposals, and speculative decoding against the target's own
// greedy decoding (lossless) on the shipped quickstart target, with every
// way a generation can end; where two outputs diverge and whether that is a
// near-tie (the spacing, the bound, a wrong token, bf16 on the CPU); plus the
// errors eval gives for bad inputs.
#include "eval/divergence.h"
#include "eval/evaluation.h"
#include "plugin/registry.h"
#include "support/expect.h"
#include "support/temp_dir.h"
#include "core/text/tiny_tokenizer.h"
#include "train/frozen_weights.h"

#include <dflash/sdk/safetensors_torch.hpp>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

namespace {
using namespace dflash;
using host::DrafterInstance;
using host::NamedTensors;
using host::PluginRegistry;
using host::TargetModelInstance;

const std::string kTarget = DFLASH_CONFIGS_DIR "/quickstart/target";
const std::string kHeldout = DFLASH_CONFIGS_DIR "/quickstart/data/heldout.jsonl";

PluginRegistry& registry() {
  static PluginRegistry r = [] {
    PluginRegistry reg;
    reg.add_directory(DFLASH_INTREE_PLUGIN_DIR);
    return reg;
  }();
  return r;
}

std::unique_ptr<TargetModelInstance> quickstart_target(const std::string& dtype = "float32") {
  const auto& record = registry().find(DFLASH_KIND_TARGET_MODEL, "hf_decoder");
  nlohmann::json config = {{"path", kTarget}, {"dtype", "auto"}, {"feature_layers", 2}, {"kernels", "auto"},
                           {"streams", 2}, {"attention", "auto"}};
  return std::make_unique<TargetModelInstance>(record, config, host::InstanceOptions{"cpu", dtype, 0});
}

std::unique_ptr<DrafterInstance> drafter(const std::string& name, nlohmann::json config, const TargetModelInstance& target) {
  const auto& record = registry().find(DFLASH_KIND_DRAFTER, name);
  auto d = std::make_unique<DrafterInstance>(record, config, host::InstanceOptions{"cpu", "float32", 7});
  d->bind_target(target.describe(), host::place_frozen_weights(target.frozen_weights(), "hf_decoder", torch::kCPU, torch::kFloat));
  return d;
}

nlohmann::json dflash_config(int64_t block_size) {
  return {{"num_layers", 2}, {"num_attention_heads", 0}, {"num_key_value_heads", 0}, {"head_dim", 0},
          {"intermediate_size", 0}, {"block_size", block_size}, {"max_anchors", 48}, {"gamma", 0.0},
          {"mask_token_id", 259}, {"target_layer_ids", nlohmann::json::array()}, {"init_std", 0.02},
          {"rope_theta", 0.0}, {"attention", "grouped"}, {"attention_group_blocks", 64}, {"attention_group_key_multiple", 128}, {"attention_kernel", "auto"},
          {"embedding_on_cpu", false}, {"activation_checkpointing", false}};
}

const at::Tensor& get(const NamedTensors& out, const std::string& name) {
  for (const auto& [key, t] : out)
    if (key == name) return t;
  throw std::runtime_error("no " + name);
}

std::vector<std::vector<int64_t>> heldout_prompts(size_t count, const std::vector<int64_t>& lengths) {
  eval::EvalSettings s;
  s.prompts_file = kHeldout;
  s.prompt_tokens = 200;
  s.max_prompts = static_cast<int64_t>(count);
  std::vector<std::vector<int64_t>> out;
  const auto prompts = eval::read_prompts(s, nlohmann::json{{"vocab_size", 260}});
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto ids = prompts[i].ids;
    ids.resize(static_cast<size_t>(lengths[i % lengths.size()]));
    out.push_back(ids);
  }
  return out;
}

TEST(TargetDecoding, KvCacheMatchesTheFullForward) {
  auto target = quickstart_target();
  ASSERT_TRUE(target->can_decode());
  const auto info = target->describe();
  EXPECT_EQ(info.at("eos_token_ids"), (nlohmann::json{257}));
  EXPECT_EQ(info.at("tokenizer").at("type"), "huggingface");
  EXPECT_EQ(info.at("tokenizer").at("path"),
            std::filesystem::canonical(std::string(DFLASH_CONFIGS_DIR) + "/quickstart/target/tokenizer.json").string());
  const auto ids = torch::tensor(heldout_prompts(1, {40})[0], torch::kLong);
  const auto full = target->forward({{"input_ids", ids.unsqueeze(0)}}, {1, 3}, false, true);
  const auto full_logits = get(full, "logits")[0], full_hidden = get(full, "hidden.3")[0];
  const double scale = full_logits.abs().max().item<double>();

  const int64_t session = target->decode_begin(40);
  // Prefill 25, then 1, then a chunk of 6, then 8 at once.
  std::vector<at::Tensor> logits, hidden;
  for (auto [from, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 25}, {25, 1}, {26, 6}, {32, 8}}) {
    const auto out = target->decode_extend(session, ids.narrow(0, from, n), {3}, true);
    logits.push_back(get(out, "logits"));
    hidden.push_back(get(out, "hidden.3"));
  }
  EXPECT_LE((torch::cat(logits) - full_logits).abs().max().item<double>(), 1e-4 * scale);
  EXPECT_LE((torch::cat(hidden) - full_hidden).abs().max().item<double>(), 1e-4 * full_hidden.abs().max().item<double>());
  // Beyond max_length: refused, and the session is unchanged.
  try {
    target->decode_extend(session, ids.narrow(0, 0, 1), {}, true);
    FAIL() << "extend past max_length must fail";
  } catch (const std::exception& e) {
    EXPECT_CONTAINS(e.what(), "beyond the session's max_length 40");
  }
  // Truncate to 30 and feed positions 30.. again: the same logits.
  target->decode_truncate(session, 30);
  const auto again = get(target->decode_extend(session, ids.narrow(0, 30, 10), {}, true), "logits");
  EXPECT_LE((again - full_logits.narrow(0, 30, 10)).abs().max().item<double>(), 1e-4 * scale);
  EXPECT_THROW(target->decode_truncate(session, 41), std::exception);
  target->decode_end(session);
  EXPECT_THROW(target->decode_extend(session, ids.narrow(0, 0, 1), {}, true), std::exception) << "an ended session is gone";
}

nlohmann::json prompt_lookup_config(int64_t block_size) {
  return {{"block_size", block_size}, {"max_ngram", 3}, {"min_ngram", 1}};
}

TEST(PromptLookup, ProposesWhatFollowedTheLatestEarlierMatch) {
  auto target = quickstart_target();
  auto d = drafter("prompt_lookup", prompt_lookup_config(5), *target);
  ASSERT_TRUE(d->can_draft());
  const int64_t session = d->draft_begin();
  d->draft_extend(session, {{"input_ids", torch::tensor({1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2}, torch::kLong)}});
  // Context + last token = … 1 2 3: the latest earlier "1 2 3" is followed by 5 6 1 2.
  EXPECT_TRUE(torch::equal(d->draft_propose(session, {{"last_token", torch::tensor({3}, torch::kLong)}}, 10),
                           torch::tensor({5, 6, 1, 2}, torch::kLong)))
      << "block_size 5 caps it at 4";
  EXPECT_TRUE(torch::equal(d->draft_propose(session, {{"last_token", torch::tensor({3}, torch::kLong)}}, 2),
                           torch::tensor({5, 6}, torch::kLong)));
  // No earlier occurrence of the last token: nothing proposed.
  EXPECT_EQ(d->draft_propose(session, {{"last_token", torch::tensor({77}, torch::kLong)}}, 4).numel(), 0);
  d->draft_end(session);
  EXPECT_THROW(d->draft_propose(session, {{"last_token", torch::tensor({3}, torch::kLong)}}, 4), std::exception);
}

// The lossless guarantee: speculative decoding emits exactly the target's
// greedy tokens, whatever the drafter proposes, for every block size and
// however the generation ends.
TEST(SpeculativeDecoding, EmitsExactlyTheTargetsGreedyTokens) {
  auto target = quickstart_target();
  const auto prompts = heldout_prompts(3, {64, 17, 101});
  eval::DecodeLimits limits;
  limits.max_new_tokens = 40;
  limits.eos_token_ids = {257};
  std::vector<eval::Generation> greedy;
  for (const auto& p : prompts) greedy.push_back(eval::greedy_decode(*target, p, limits));
  for (const auto& g : greedy) {
    EXPECT_EQ(g.tokens.size(), 40u);
    EXPECT_EQ(g.stop_reason, "max_new_tokens");
    EXPECT_EQ(g.target_passes, 40);
  }
  int64_t accepted_total = 0;
  for (const std::string name : {"dflash", "prompt_lookup"})
    for (int64_t block_size : {2, 4, 8, 16}) {
      SCOPED_TRACE(name + ", block size " + std::to_string(block_size));
      auto d = drafter(name, name == "dflash" ? dflash_config(block_size) : prompt_lookup_config(block_size), *target);
      const auto layers = d->export_config()->at("target_layer_ids").get<std::vector<int64_t>>();
      for (size_t i = 0; i < prompts.size(); ++i) {
        const auto spec = eval::speculative_decode(*target, *d, prompts[i], limits, block_size, layers);
        EXPECT_EQ(spec.tokens, greedy[i].tokens) << "prompt " << i;
        EXPECT_EQ(spec.stop_reason, "max_new_tokens");
        EXPECT_EQ(spec.target_passes, 1 + static_cast<int64_t>(spec.step_tokens.size()));
        for (size_t k = 0; k < spec.step_tokens.size(); ++k) {
          EXPECT_LE(spec.step_proposed[k], block_size - 1);
          EXPECT_LE(spec.step_accepted[k], spec.step_proposed[k]);
          accepted_total += spec.step_accepted[k];
        }
      }
    }
  EXPECT_GT(accepted_total, 20) << "the drafters' proposals were accepted at times, so acceptance paths ran";

  // Ends: an end-of-sequence token, and the maximum length. The quickstart
  // target never picks its own EOS (257) greedily (none at 19,043 scanned
  // positions of its training text), so a token its greedy output holds is
  // declared the end-of-sequence id: the same stop path.
  const auto& g = greedy[0].tokens;
  size_t first = 5;
  while (std::find(g.begin(), g.begin() + static_cast<long>(first), g[first]) != g.begin() + static_cast<long>(first)) ++first;
  eval::DecodeLimits eos = limits;
  eos.eos_token_ids = {g[first]};
  eval::DecodeLimits length = limits;
  length.max_length = static_cast<int64_t>(prompts[0].size()) + 9;
  for (const std::string name : {"dflash", "prompt_lookup"}) {
    auto d = drafter(name, name == "dflash" ? dflash_config(8) : prompt_lookup_config(8), *target);
    const auto layers = d->export_config()->at("target_layer_ids").get<std::vector<int64_t>>();
    const auto a = eval::greedy_decode(*target, prompts[0], eos), b = eval::speculative_decode(*target, *d, prompts[0], eos, 8, layers);
    EXPECT_EQ(a.tokens, std::vector<int64_t>(g.begin(), g.begin() + static_cast<long>(first) + 1)) << name;
    EXPECT_EQ(b.tokens, a.tokens) << name;
    EXPECT_EQ(a.stop_reason, "eos");
    EXPECT_EQ(b.stop_reason, "eos");
    const auto c = eval::greedy_decode(*target, prompts[0], length), e = eval::speculative_decode(*target, *d, prompts[0], length, 8, layers);
    EXPECT_EQ(c.tokens.size(), 9u);
    EXPECT_EQ(e.tokens, c.tokens) << name;
    EXPECT_EQ(c.stop_reason, "max_length");
    EXPECT_EQ(e.stop_reason, "max_length");
  }
}

// A profile charges every phase of a decoding and changes nothing in it: the
// same tokens, the passes counted, and the phases adding up to the wall time.
TEST(SpeculativeDecoding, AProfileChargesEveryPhaseAndChangesNothing) {
  auto target = quickstart_target();
  auto d = drafter("dflash", dflash_config(8), *target);
  const auto layers = d->export_config()->at("target_layer_ids").get<std::vector<int64_t>>();
  const auto prompt = heldout_prompts(1, {40})[0];
  eval::DecodeLimits limits;
  limits.max_new_tokens = 24;
  int64_t waits = 0;
  eval::DecodeProfile greedy_profile, spec_profile;
  greedy_profile.sync = spec_profile.sync = [&] { ++waits; };
  const auto plain = eval::greedy_decode(*target, prompt, limits);
  const auto greedy = eval::greedy_decode(*target, prompt, limits, &greedy_profile);
  EXPECT_EQ(greedy.tokens, plain.tokens);
  EXPECT_EQ(greedy_profile.tokens, 24);
  EXPECT_EQ(greedy_profile.steps, greedy.target_passes - 1);
  EXPECT_GT(greedy_profile.target, 0);
  EXPECT_GT(greedy_profile.accept, 0);
  EXPECT_EQ(greedy_profile.propose + greedy_profile.extend, 0.0) << "no drafter";
  const double greedy_sum = greedy_profile.target + greedy_profile.accept + greedy_profile.other;
  EXPECT_NEAR(greedy_sum, greedy.seconds, 0.02 + 0.1 * greedy.seconds);
  EXPECT_GE(waits, 2 * greedy.target_passes) << "a wait after every phase";

  const auto spec = eval::speculative_decode(*target, *d, prompt, limits, 8, layers, &spec_profile);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_EQ(spec_profile.steps, static_cast<int64_t>(spec.step_tokens.size()));
  EXPECT_EQ(spec_profile.tokens, 24);
  for (double phase : {spec_profile.target, spec_profile.propose, spec_profile.extend, spec_profile.accept})
    EXPECT_GT(phase, 0);
  const double spec_sum = spec_profile.target + spec_profile.propose + spec_profile.extend + spec_profile.accept + spec_profile.other;
  EXPECT_NEAR(spec_sum, spec.seconds, 0.02 + 0.1 * spec.seconds);
}

// On a GPU in bf16, the decoding path eval runs (our kernels, flash attention
// straight over the pooled cache, single-session steps replayed as CUDA
// graphs) against the same kernels launched eagerly and against the ATen
// reference path, fed the same tokens: a prefill, single tokens, verification
// blocks returning layers, a truncation, and a second sequence in the kept
// pool. Then greedy and speculative decoding through the graphs.
TEST(TargetDecoding, CudaGraphsAndFlashDecodingAgreeWithTheReferencePath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto& record = registry().find(DFLASH_KIND_TARGET_MODEL, "hf_decoder");
  auto on_gpu = [&](const char* kernels, const char* graphs) {
    nlohmann::json config = {{"path", kTarget}, {"dtype", "auto"}, {"feature_layers", 2}, {"kernels", kernels},
                             {"streams", 2}, {"attention", "auto"}, {"decode_graphs", graphs}};
    return std::make_unique<TargetModelInstance>(record, config, host::InstanceOptions{"cuda", "bfloat16", 0});
  };
  auto graphed = on_gpu("auto", "auto"), eager = on_gpu("auto", "off"), reference = on_gpu("aten", "off");
  const auto info = graphed->describe();
  if (!info.at("flash_decoding").get<bool>()) GTEST_SKIP() << "this build has no flash decoding (kernels or LibTorch < 2.5)";
  EXPECT_TRUE(info.at("decode_graphs").get<bool>());
  EXPECT_FALSE(eager->describe().at("decode_graphs").get<bool>());
  const std::vector<TargetModelInstance*> targets = {graphed.get(), eager.get(), reference.get()};
  const auto prompts = heldout_prompts(2, {50, 23});
  for (const auto& prompt : prompts) {
    std::vector<int64_t> sessions;
    for (auto* t : targets) sessions.push_back(t->decode_begin(200));
    // One step for all three: the reference's greedy token(s) fed to each; the graphs' outputs
    // equal the eager kernels' (the same kernels) and stay within bf16 rounding of the reference.
    auto step = [&](const torch::Tensor& tokens, const std::vector<int64_t>& layers) {
      std::vector<NamedTensors> outs;
      for (size_t i = 0; i < targets.size(); ++i) outs.push_back(targets[i]->decode_extend(sessions[i], tokens, layers, true));
      const auto x = get(outs[0], "logits").to(torch::kFloat), y = get(outs[1], "logits").to(torch::kFloat);
      const auto z = get(outs[2], "logits").to(torch::kFloat);
      const double scale = z.abs().max().item<double>();
      EXPECT_LE((x - y).abs().max().item<double>(), 1e-3 * scale) << "graph replay against the same kernels run eagerly";
      EXPECT_LE((x - z).abs().max().item<double>(), 3e-2 * scale) << "against the ATen reference";
      for (int64_t layer : layers) {
        const std::string name = "hidden." + std::to_string(layer);
        const auto a = get(outs[0], name).to(torch::kFloat), c = get(outs[2], name).to(torch::kFloat);
        EXPECT_LE((a - c).abs().max().item<double>(), 3e-2 * c.abs().max().item<double>()) << name;
      }
      return z.argmax(-1).to(torch::kCPU);
    };
    auto next = step(torch::tensor(prompt, torch::kLong), {});
    for (int i = 0; i < 6; ++i) next = step(next.narrow(0, next.size(0) - 1, 1), {});  // generation: one token a step
    for (int i = 0; i < 3; ++i) {
      // verification-like blocks of 5, returning two layers, then 3 of them dropped
      const auto block = torch::cat({next.narrow(0, next.size(0) - 1, 1), torch::tensor({65, 66, 67, 68}, torch::kLong)});
      next = step(block, {1, 3});
      for (size_t k = 0; k < targets.size(); ++k) targets[k]->decode_truncate(sessions[k], static_cast<int64_t>(prompt.size()) + 6 + 2 * (i + 1));
      next = next.narrow(0, 0, 2);
    }
    for (size_t k = 0; k < targets.size(); ++k) targets[k]->decode_end(sessions[k]);
  }
  const auto stats = graphed->describe().at("decode_graph_stats");
  EXPECT_EQ(stats.at("failed").get<int64_t>(), 0) << stats.dump();
  EXPECT_GE(stats.at("captured").get<int64_t>(), 2) << stats.dump();
  EXPECT_GE(stats.at("replayed").get<int64_t>(), 10) << stats.dump();

  // Greedy decoding: the graphs give the eager kernels' tokens; speculative
  // decoding through graphs (target and drafter) gives the greedy tokens.
  eval::DecodeLimits limits;
  limits.max_new_tokens = 40;
  const auto long_prompts = heldout_prompts(3, {64, 17, 101});
  nlohmann::json dflash = dflash_config(8);
  dflash["decode_graphs"] = "auto";
  const auto& drafter_record = registry().find(DFLASH_KIND_DRAFTER, "dflash");
  auto d = std::make_unique<DrafterInstance>(drafter_record, dflash, host::InstanceOptions{"cuda", "bfloat16", 7});
  d->bind_target(graphed->describe(),
                 host::place_frozen_weights(graphed->frozen_weights(), "hf_decoder", torch::Device("cuda"), torch::kBFloat16));
  const auto layers = d->export_config()->at("target_layer_ids").get<std::vector<int64_t>>();
  int64_t identical = 0;
  for (const auto& p : long_prompts) {
    const auto a = eval::greedy_decode(*graphed, p, limits), b = eval::greedy_decode(*eager, p, limits);
    EXPECT_EQ(a.tokens, b.tokens);
    const auto spec = eval::speculative_decode(*graphed, *d, p, limits, 8, layers);
    identical += spec.tokens == a.tokens;
  }
  // In bf16 a verification block's logits round differently from one token's, so a near tie may
  // flip; in fp32 on the CPU the test above demands every token.
  EXPECT_GE(identical, 2) << "speculative decoding through the graphs against greedy decoding";
  EXPECT_EQ(graphed->describe().at("decode_graph_stats").at("failed").get<int64_t>(), 0);
}

// A folder given as the prompts file is named as one (it used to "hold no
// prompts"), and the report's path is checked before anything runs.
TEST(Eval, PromptsAndReportPathsAreCheckedUpFront) {
  test::TempDir temp("dflash_eval_paths");
  const std::string dir = temp.path().string();
  auto error_of = [](auto&& call) {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  eval::EvalSettings s;
  s.prompts_file = dir;
  EXPECT_CONTAINS(error_of([&] { eval::read_prompts(s, nlohmann::json{{"vocab_size", 260}}); }),
                  dir + " is a directory, not a prompts file; give a JSON-lines file of prompts");
  EXPECT_CONTAINS(error_of([&] { eval::check_prompts_file(dir + "/missing.jsonl"); }),
                  dir + "/missing.jsonl: no such prompts file");
  EXPECT_CONTAINS(error_of([&] { eval::check_prompts_file("/dev/null"); }), "/dev/null is not a regular file");

  EXPECT_CONTAINS(error_of([&] { eval::check_report_file(dir); }), "--report " + dir + " is a directory; give a file name");
  EXPECT_CONTAINS(error_of([&] { eval::check_report_file(dir + "/no/r.json"); }),
                  "--report " + dir + "/no/r.json: the folder " + dir + "/no does not exist; create it first");
  EXPECT_CONTAINS(error_of([&] { eval::check_report_file(""); }), "--report needs a file name");
  // A new file in an existing folder, or an existing file: fine, and nothing is created or truncated.
  EXPECT_EQ(error_of([&] { eval::check_report_file(dir + "/r.json"); }), "no error");
  EXPECT_FALSE(std::filesystem::exists(dir + "/r.json"));
  std::ofstream(dir + "/old.json") << "{}";
  EXPECT_EQ(error_of([&] { eval::check_report_file(dir + "/old.json"); }), "no error");
  EXPECT_EQ(std::filesystem::file_size(dir + "/old.json"), 2u);
}

TEST(Eval, BadInputsGetClearErrors) {
  auto target = quickstart_target();
  const auto info = target->describe();
  auto lookup = drafter("prompt_lookup", prompt_lookup_config(4), *target);
  eval::DecodeLimits limits;
  limits.max_length = 32;
  try {
    eval::greedy_decode(*target, {}, limits);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "the prompt is empty");
  }
  try {
    eval::speculative_decode(*target, *lookup, std::vector<int64_t>(40, 65), limits, 4, {});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "the prompt has 40 tokens, not fewer than max_length 32");
  }
  test::TempDir temp("dflash_eval");
  const std::string dir = temp.path().string();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  eval::EvalSettings s;
  auto prompts_error = [&](const std::string& text) {
    s.prompts_file = write("p.jsonl", text);
    try {
      eval::read_prompts(s, info);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_CONTAINS(prompts_error("{\"prompt_ids\": [1, 2]}\n{\"prompt_ids\": []}\n"), "p.jsonl:2: the prompt is empty");
  EXPECT_CONTAINS(prompts_error("{\"prompt_ids\": [1, 999]}\n"), "p.jsonl:1: \"prompt_ids\" holds id 999, outside the target's vocabulary [0, 260)");
  // 2^64 − 1 is named as written (it was "id -1"), and so is a negative id.
  EXPECT_CONTAINS(prompts_error("{\"prompt_ids\": [1, 18446744073709551615]}\n"),
                  "p.jsonl:1: \"prompt_ids\" holds id 18446744073709551615, outside the target's vocabulary [0, 260)");
  EXPECT_CONTAINS(prompts_error("{\"prompt_ids\": [-3]}\n"),
                  "p.jsonl:1: \"prompt_ids\" holds id -3, outside the target's vocabulary [0, 260)");
  EXPECT_CONTAINS(prompts_error("not json\n"), "p.jsonl:1: not a JSON object");
  EXPECT_CONTAINS(prompts_error("{\"ids\": [1]}\n"), "p.jsonl:1: needs \"prompt_ids\", \"input_ids\" or \"text\"");
  EXPECT_CONTAINS(prompts_error("\n\n"), "holds no prompts");
  // Text through the target's byte-level tokenizer: BOS, then the bytes.
  s.prompts_file = write("t.jsonl", "{\"text\": \"hi\"}\n");
  EXPECT_EQ(eval::read_prompts(s, info).at(0).ids, (std::vector<int64_t>{256, 'h', 'i'}));
  nlohmann::json no_tokenizer = info;
  no_tokenizer["tokenizer"] = nullptr;
  try {
    eval::read_prompts(s, no_tokenizer);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "t.jsonl:1: a text prompt needs a tokenizer");
  }
  // Text through a Hugging Face BPE tokenizer.json (the tokenizer tests' small one), whose ids
  // must fit the target's vocabulary (260 here), and a tokenizer file that cannot be read.
  nlohmann::json bpe = info;
  bpe["tokenizer"] = {{"type", "huggingface"}, {"path", write("tokenizer.json", test::tiny_tokenizer_json().dump())}};
  s.prompts_file = write("t.jsonl", "{\"text\": \"hello\"}\n");
  EXPECT_EQ(eval::read_prompts(s, bpe).at(0).ids, (std::vector<int64_t>{259}));  // "hello" is one merged token
  const auto text_error = [&](const std::string& line) {
    s.prompts_file = write("t.jsonl", line);
    try {
      eval::read_prompts(s, bpe);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_CONTAINS(text_error("{\"text\": \"hello world\"}\n"),
                  "t.jsonl:1: the tokenizer " + dir + "/tokenizer.json gives id 264, outside the target's vocabulary [0, 260)");
  write("tokenizer.json", "{\"model\": ");
  EXPECT_CONTAINS(text_error("{\"text\": \"hello\"}\n"), "t.jsonl:1: a text prompt needs the target's tokenizer, which "
                                                          "cannot be used: tokenizer file " + dir + "/tokenizer.json: invalid JSON");

  // Drafter checkpoints that do not fit the target or the drafter.
  auto dflash = drafter("dflash", dflash_config(8), *target);
  nlohmann::json config = *dflash->export_config();
  auto checkpoint_error = [&](const nlohmann::json& cfg, const NamedTensors& weights) {
    const std::string ckpt = dir + "/ckpt";
    std::filesystem::create_directories(ckpt);
    std::ofstream(ckpt + "/config.json") << cfg.dump();
    sdk::safetensors::save_tensors(ckpt + "/model.safetensors", weights);
    try {
      eval::load_drafter_checkpoint(ckpt, *dflash, info);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const NamedTensors weights = dflash->parameters();
  EXPECT_EQ(checkpoint_error(config, weights), "no error");
  nlohmann::json bad = config;
  bad["vocab_size"] = 32000;
  EXPECT_CONTAINS(checkpoint_error(bad, weights), "config.json: vocab_size is 32000 but the target has 260");
  bad = config;
  bad["hidden_size"] = 64;
  EXPECT_CONTAINS(checkpoint_error(bad, weights), "config.json: hidden_size is 64 but the target has 192");
  bad = config;
  bad["target_layer_ids"] = {1, 9};
  EXPECT_CONTAINS(checkpoint_error(bad, weights), "config.json: target_layer_ids is [1,9] but the configured drafter");
  bad = config;
  bad["block_size"] = 16;
  EXPECT_CONTAINS(checkpoint_error(bad, weights), "block_size is 16 but the configured drafter (set it in the config's drafter section) has 8");
  // What the drafter itself names (ABI 1.5's checkpoint_match): a head count
  // whose weights' shapes would all still agree (twice the heads of half the
  // width) is refused by name, not loaded into the wrong split.
  const std::optional<nlohmann::json> match = dflash->checkpoint_match();
  ASSERT_TRUE(match.has_value());
  EXPECT_EQ(match->at("target").at("hidden_size"), "hidden_size");
  bad = config;
  bad["num_attention_heads"] = 2 * config.at("num_attention_heads").get<int64_t>();
  bad["head_dim"] = config.at("head_dim").get<int64_t>() / 2;
  EXPECT_CONTAINS(checkpoint_error(bad, weights), "config.json: num_attention_heads is " + bad["num_attention_heads"].dump() +
                                                      " but the configured drafter");
  // A drafter that names nothing (prompt lookup) is held to the host's three facts alone.
  EXPECT_FALSE(drafter("prompt_lookup", prompt_lookup_config(8), *target)->checkpoint_match().has_value());
  NamedTensors wrong = weights;
  wrong[0].second = torch::zeros({3, 3});
  EXPECT_CONTAINS(checkpoint_error(config, wrong), "model.safetensors: tensor '" + weights[0].first + "' has shape [3, 3]");
  EXPECT_CONTAINS([&] {
    try {
      eval::load_drafter_checkpoint(dir + "/nowhere", *dflash, info);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), "not a drafter directory");
}

// The spacing is the unit in the last place of the logits' dtype: at each
// magnitude, x + spacing is representable and x + spacing / 2 is not.
TEST(Divergence, SpacingIsTheUnitInTheLastPlaceOfTheDtype) {
  using c10::ScalarType;
  EXPECT_EQ(eval::logit_spacing(1.0, ScalarType::BFloat16), std::ldexp(1.0, -7));
  EXPECT_EQ(eval::logit_spacing(10.0, ScalarType::BFloat16), 0.0625) << "the ~0.06 at |logit| ≈ 10";
  EXPECT_EQ(eval::logit_spacing(-10.0, ScalarType::BFloat16), 0.0625) << "the magnitude counts, not the sign";
  EXPECT_EQ(eval::logit_spacing(0.75, ScalarType::BFloat16), std::ldexp(1.0, -8));
  EXPECT_EQ(eval::logit_spacing(16.0, ScalarType::BFloat16), 0.125) << "a power of two opens the next binade";
  EXPECT_EQ(eval::logit_spacing(1000.0, ScalarType::BFloat16), 4.0);
  EXPECT_EQ(eval::logit_spacing(0.0, ScalarType::BFloat16), std::ldexp(1.0, -133)) << "subnormal spacing";
  EXPECT_EQ(eval::logit_spacing(1.0, ScalarType::Half), std::ldexp(1.0, -10));
  EXPECT_EQ(eval::logit_spacing(10.0, ScalarType::Half), std::ldexp(1.0, -7));
  EXPECT_EQ(eval::logit_spacing(60000.0, ScalarType::Half), 32.0);
  EXPECT_EQ(eval::logit_spacing(1e-6, ScalarType::Half), std::ldexp(1.0, -24)) << "fp16 subnormal spacing";
  EXPECT_EQ(eval::logit_spacing(1.0, ScalarType::Float), std::ldexp(1.0, -23));
  EXPECT_EQ(eval::logit_spacing(10.0, ScalarType::Float), std::ldexp(1.0, -20));
  EXPECT_EQ(eval::logit_spacing(-0.3, ScalarType::Float), std::ldexp(1.0, -25));
  auto rounded = [](double v, ScalarType t) { return torch::scalar_tensor(v, torch::kDouble).to(t).item<double>(); };
  for (ScalarType t : {ScalarType::BFloat16, ScalarType::Half, ScalarType::Float})
    for (double x : {0.09375, 0.75, 1.0, 1.5, 3.0, 9.5, 10.0, 11.375, 24.0, 100.0, -7.25}) {
      SCOPED_TRACE(std::string(c10::toString(t)) + " at " + std::to_string(x));
      const double s = eval::logit_spacing(x, t), up = std::fabs(x) + s;
      ASSERT_EQ(rounded(x, t), x) << "test values are representable";
      EXPECT_EQ(rounded(up, t), up) << "the next value up is representable";
      EXPECT_NE(rounded(std::fabs(x) + s / 2, t), std::fabs(x) + s / 2) << "nothing lies between";
    }
  EXPECT_THROW(eval::logit_spacing(1.0, ScalarType::Long), std::invalid_argument);
  try {
    eval::logit_spacing(1.0, ScalarType::Int);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "logits of dtype Int have no spacing: the target's logits must be bfloat16, float16, float32 or float64");
  }
  EXPECT_THROW(eval::logit_spacing(NAN, ScalarType::Float), std::invalid_argument);
  EXPECT_THROW(eval::near_tie_spacings(ScalarType::Bool), std::invalid_argument);
}

// The classifier at its boundary, on constructed rows of logits: a gap of
// exactly the bound is a near-tie, one spacing more is not.
TEST(Divergence, NearTieBoundary) {
  using c10::ScalarType;
  EXPECT_EQ(eval::near_tie_spacings(ScalarType::BFloat16), 8.0);
  EXPECT_EQ(eval::near_tie_spacings(ScalarType::Half), 8.0);
  EXPECT_EQ(eval::near_tie_spacings(ScalarType::Float), 128.0);
  for (ScalarType t : {ScalarType::BFloat16, ScalarType::Half, ScalarType::Float}) {
    SCOPED_TRACE(c10::toString(t));
    const double top = 10.0, s = eval::logit_spacing(top, t), bound = eval::near_tie_spacings(t);
    EXPECT_TRUE(eval::is_near_tie(bound * s, s, t));
    EXPECT_FALSE(eval::is_near_tie(std::nextafter(bound * s, 1e9), s, t));
    // Token 3 tops the row; token 5 lies the bound below it, token 6 one spacing further.
    auto row = torch::full({8}, -4.0, torch::kDouble);
    row[3] = top;
    row[5] = top - bound * s;
    row[6] = top - (bound + 1) * s;
    row = row.to(t);
    const eval::Divergence at_bound = eval::divergence_at(17, 5, 3, row);
    EXPECT_TRUE(at_bound.near_tie);
    EXPECT_EQ(at_bound.gap, bound * s);
    EXPECT_EQ(at_bound.spacing, s);
    EXPECT_EQ(at_bound.top_logit, top);
    EXPECT_EQ(at_bound.top_token, 3);
    const nlohmann::json j = at_bound.to_json();
    EXPECT_EQ(j.at("position"), 17);
    EXPECT_EQ(j.at("speculative_token"), 5);
    EXPECT_EQ(j.at("greedy_token"), 3);
    EXPECT_EQ(j.at("speculative_logit").get<double>(), top - bound * s);
    EXPECT_EQ(j.at("greedy_logit").get<double>(), top);
    EXPECT_EQ(j.at("gap_spacings").get<double>(), bound);
    EXPECT_EQ(j.at("dtype"), eval::dtype_name(t));
    EXPECT_EQ(j.at("extra_pass_prefers"), "greedy");
    EXPECT_FALSE(eval::divergence_at(17, 6, 3, row).near_tie) << "one spacing beyond the bound";
    EXPECT_EQ(eval::divergence_at(17, 3, 6, row).to_json().at("extra_pass_prefers"), "speculative");
  }
  // An exact tie (frequent in bf16): gap 0, neither preferred.
  auto tie = torch::tensor({1.0, 9.5, 9.5}, torch::kBFloat16);
  EXPECT_EQ(eval::divergence_at(0, 2, 1, tie).to_json().at("extra_pass_prefers"), "equal");
  EXPECT_TRUE(eval::divergence_at(0, 2, 1, tie).near_tie);
  // Non-finite logits are no tie; bad rows and tokens are refused with the reason.
  auto broken = torch::tensor({1.0, std::nan(""), 2.0}, torch::kFloat);
  EXPECT_FALSE(eval::divergence_at(0, 1, 2, broken).near_tie);
  EXPECT_EQ(eval::divergence_at(0, 1, 2, broken).note, "the target's logits there are not finite");
  try {
    eval::divergence_at(0, 1, 7, broken);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "token 7 is outside the vocabulary [0, 3)");
  }
  EXPECT_THROW(eval::divergence_at(0, 1, 2, broken.unsqueeze(0)), std::invalid_argument);
  EXPECT_THROW(eval::divergence_at(0, 1, 2, torch::tensor({1, 2, 3}, torch::kLong)), std::invalid_argument);
}

// A real bug: an output that skipped one of the target's tokens (an
// off-by-one in acceptance). The report builder measures it on the quickstart
// target, and it is a wrong token: a gap of whole logits, classified "other".
// The summary and the console line say so; a near-tie row beside it counts as one.
TEST(Divergence, AWrongTokenIsAnotherDivergenceWithAWholeLogitGap) {
  auto target = quickstart_target();
  const auto prompt = heldout_prompts(1, {64})[0];
  eval::DecodeLimits limits;
  limits.max_new_tokens = 24;
  const std::vector<int64_t> greedy = eval::greedy_decode(*target, prompt, limits).tokens;
  EXPECT_FALSE(eval::find_divergence(*target, prompt, greedy, greedy)) << "equal outputs have no divergence";
  size_t k = 6;
  while (k + 2 < greedy.size() && greedy[k] == greedy[k + 1]) ++k;
  ASSERT_NE(greedy[k], greedy[k + 1]) << "the prompt's greedy output varies";
  std::vector<int64_t> wrong(greedy.begin(), greedy.begin() + static_cast<long>(k));
  wrong.insert(wrong.end(), greedy.begin() + static_cast<long>(k) + 1, greedy.end());
  wrong.push_back(greedy.back());
  const auto d = eval::find_divergence(*target, prompt, wrong, greedy);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->position, static_cast<int64_t>(k));
  EXPECT_EQ(*d->speculative_token, greedy[k + 1]);
  EXPECT_EQ(*d->greedy_token, greedy[k]);
  EXPECT_EQ(d->dtype, c10::ScalarType::Float);
  EXPECT_EQ(d->top_token, greedy[k]) << "the extra pass agrees with greedy decoding (fp32)";
  EXPECT_EQ(d->greedy_logit, d->top_logit);
  EXPECT_GE(d->gap, 1.0) << "a wrong token lies whole logits below the top";
  EXPECT_FALSE(d->near_tie);
  EXPECT_GT(d->gap / d->spacing, 1e4 * eval::near_tie_spacings(c10::ScalarType::Float));
  EXPECT_EQ(d->to_json().at("extra_pass_prefers"), "greedy");
  std::printf("the skipped token: gap %.3f logits = %.3g fp32 spacings\n", d->gap, d->gap / d->spacing);
  // An output cut short after the same tokens: no stopping rule does that.
  const auto cut = eval::find_divergence(*target, prompt, std::vector<int64_t>(greedy.begin(), greedy.begin() + 10), greedy);
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->position, 10);
  EXPECT_FALSE(cut->speculative_token);
  EXPECT_FALSE(cut->near_tie);
  EXPECT_TRUE(cut->to_json().at("speculative_token").is_null());
  EXPECT_CONTAINS(cut->note, "the speculative output ends here and the other goes on");

  // The report: one identical prompt, one near-tie, this wrong token.
  auto tie_row = torch::tensor({2.0, 9.5, 9.4375}, torch::kBFloat16);
  nlohmann::json per_prompt = {{{"identical_to_greedy", true}},
                               {{"identical_to_greedy", false}, {"divergence", eval::divergence_at(30, 2, 1, tie_row).to_json()}},
                               {{"identical_to_greedy", false}, {"divergence", d->to_json()}}};
  nlohmann::json report = eval::lossless_summary(per_prompt);
  EXPECT_EQ(report.at("identical_prompts"), 1);
  EXPECT_EQ(report.at("near_tie_divergences"), 1);
  EXPECT_EQ(report.at("other_divergences"), 1);
  EXPECT_FALSE(report.at("lossless").get<bool>());
  EXPECT_FALSE(report.at("lossless_up_to_ties").get<bool>());
  EXPECT_EQ(report.at("near_tie_bound"), (nlohmann::json{{"spacings", 8.0}, {"dtype", "bfloat16"}}));
  report["per_prompt"] = per_prompt;
  EXPECT_EQ(eval::lossless_line(report),
            "NO: 1 of 3 identical; 1 diverges at near-ties (gap ≤ 8 bf16 spacings); 1 other divergence: wrong tokens, not "
            "rounding (see per_prompt divergence)");
  EXPECT_CONTAINS(eval::divergence_line(d->to_json()), "at token " + std::to_string(k) + ": NOT a near-tie, gap ");
  EXPECT_EQ(eval::divergence_line(per_prompt[1].at("divergence")), "at token 30: near-tie, gap 0.0625 = 1 bf16 spacing");
  // Without the wrong token: lossless up to ties.
  per_prompt.erase(2);
  report = eval::lossless_summary(per_prompt);
  EXPECT_TRUE(report.at("lossless_up_to_ties").get<bool>());
  EXPECT_FALSE(report.at("lossless").get<bool>());
  report["per_prompt"] = per_prompt;
  EXPECT_EQ(eval::lossless_line(report), "NO: 1 of 2 identical; the other 1 diverges at near-ties (gap ≤ 8 bf16 spacings); "
                                         "0 other divergences: lossless up to rounding ties");
}

// In bf16 on the CPU the verification pass and one-token decoding round
// differently too, and outputs can part at ties: eval measures each
// divergence with the extra pass, and every one is a near-tie. (Whether a
// tie is met depends on the CPU's kernels; where none is, the outputs are
// identical, which the check accepts as well.)
TEST(Divergence, Bf16EvalIsLosslessUpToTies) {
  auto target = quickstart_target("bfloat16");
  const auto& record = registry().find(DFLASH_KIND_DRAFTER, "prompt_lookup");
  DrafterInstance lookup(record, prompt_lookup_config(16), host::InstanceOptions{"cpu", "bfloat16", 7});
  lookup.bind_target(target->describe(),
                     host::place_frozen_weights(target->frozen_weights(), "hf_decoder", torch::kCPU, torch::kBFloat16));
  eval::EvalSettings s;
  s.prompts_file = kHeldout;
  s.max_prompts = 3;
  s.max_new_tokens = 96;
  const auto info = target->describe();
  const nlohmann::json r = eval::evaluate(*target, lookup, host::drafter_facts(lookup), eval::read_prompts(s, info), s, info);
  EXPECT_TRUE(r.at("lossless_up_to_ties").get<bool>()) << eval::format_report(r);
  EXPECT_EQ(r.at("other_divergences"), 0);
  EXPECT_EQ(r.at("identical_prompts").get<int64_t>() + r.at("near_tie_divergences").get<int64_t>(), 3);
  for (const auto& row : r.at("per_prompt")) {
    EXPECT_EQ(row.contains("divergence"), !row.at("identical_to_greedy").get<bool>());
    if (!row.contains("divergence")) continue;
    const auto& d = row.at("divergence");
    EXPECT_EQ(d.at("dtype"), "bfloat16");
    EXPECT_LE(d.at("gap_spacings").get<double>(), 8.0);
    const auto& greedy = row.at("greedy_tokens");
    const int64_t i = d.at("position").get<int64_t>();
    EXPECT_EQ(row.at("tokens")[i], d.at("speculative_token"));
    EXPECT_EQ(greedy[i], d.at("greedy_token"));
    for (int64_t j = 0; j < i; ++j) EXPECT_EQ(row.at("tokens")[j], greedy[j]) << "the first difference";
  }
  std::printf("bf16 on this CPU: %lld of 3 identical, %lld near-tie divergences\n",
              static_cast<long long>(r.at("identical_prompts").get<int64_t>()),
              static_cast<long long>(r.at("near_tie_divergences").get<int64_t>()));
}

// eval decodes its first prompt once before the clocks (one-time costs are
// not charged to it): the drafter's and target's sessions after that
// warm-up must give every prompt the same tokens, steps and τ as a cold run.
TEST(Eval, TheWarmupChangesNoResult) {
  auto target = quickstart_target();
  auto d = drafter("dflash", dflash_config(8), *target);
  d->set_training(false);
  eval::EvalSettings s;
  s.prompts_file = kHeldout;
  s.max_prompts = 2;
  s.max_new_tokens = 24;
  const auto info = target->describe();
  const auto prompts = eval::read_prompts(s, info);
  s.warmup = false;
  const nlohmann::json cold = eval::evaluate(*target, *d, host::drafter_facts(*d), prompts, s, info);
  s.warmup = true;
  const nlohmann::json warm = eval::evaluate(*target, *d, host::drafter_facts(*d), prompts, s, info);
  EXPECT_EQ(cold.at("warmup_prompts"), 0);
  EXPECT_EQ(warm.at("warmup_prompts"), 1);
  ASSERT_EQ(warm.at("per_prompt").size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto &a = cold.at("per_prompt")[i], &b = warm.at("per_prompt")[i];
    EXPECT_EQ(a.at("tokens"), b.at("tokens")) << "prompt " << i;
    EXPECT_EQ(a.at("target_passes"), b.at("target_passes")) << "prompt " << i;
    EXPECT_EQ(a.at("identical_to_greedy"), b.at("identical_to_greedy")) << "prompt " << i;
  }
  EXPECT_EQ(cold.at("tau_histogram"), warm.at("tau_histogram"));
  EXPECT_EQ(cold.at("acceptance_by_position"), warm.at("acceptance_by_position"));
}

// --draft-tokens: a chain asks the drafter for that many tokens a step,
// whatever its block, and stays lossless.
TEST(Eval, DraftTokensSetTheChainsLength) {
  auto target = quickstart_target();
  const auto drafter_instance = drafter("prompt_lookup", prompt_lookup_config(16), *target);
  const DrafterInstance& lookup = *drafter_instance;
  eval::EvalSettings s;
  s.prompts_file = kHeldout;
  s.max_prompts = 3;
  s.max_new_tokens = 64;
  const auto info = target->describe();
  const auto prompts = eval::read_prompts(s, info);
  const nlohmann::json whole = eval::evaluate(*target, lookup, host::drafter_facts(lookup), prompts, s, info);
  s.draft_tokens = 2;
  const nlohmann::json short_chain = eval::evaluate(*target, lookup, host::drafter_facts(lookup), prompts, s, info);
  EXPECT_EQ(whole.at("draft_tokens"), 15);
  EXPECT_EQ(short_chain.at("draft_tokens"), 2);
  EXPECT_EQ(short_chain.at("block_size"), 3);
  int64_t longest = 0;
  for (const auto& [tokens, count] : short_chain.at("tau_histogram").items()) longest = std::max<int64_t>(longest, std::stoll(tokens));
  EXPECT_LE(longest, 3);  // the newest token and at most 2 proposals a step
  int64_t longest_whole = 0;
  for (const auto& [tokens, count] : whole.at("tau_histogram").items()) longest_whole = std::max<int64_t>(longest_whole, std::stoll(tokens));
  EXPECT_GT(longest_whole, 3) << "the quickstart prompts repeat enough for prompt lookup to take longer chains";
  EXPECT_TRUE(short_chain.at("lossless").get<bool>()) << eval::format_report(short_chain);
}

// The fp32 lossless check loads a checkpoint trained in bf16 into an fp32
// drafter: copy_ converts, every value exactly (bf16 ⊂ fp32), the drafter stays fp32.
TEST(Eval, ABf16CheckpointLoadsIntoAnFp32Drafter) {
  auto target = quickstart_target();
  auto d = drafter("dflash", dflash_config(8), *target);
  test::TempDir temp("dflash_eval_bf16");
  const std::string ckpt = temp.path().string();
  NamedTensors bf16;
  for (const auto& [name, t] : d->parameters()) bf16.emplace_back(name, (t.detach() * 1.37 + 0.01).to(torch::kBFloat16));
  std::ofstream(ckpt + "/config.json") << d->export_config()->dump();
  sdk::safetensors::save_tensors(ckpt + "/model.safetensors", bf16);
  eval::load_drafter_checkpoint(ckpt, *d, target->describe());
  const NamedTensors loaded = d->parameters();
  ASSERT_EQ(loaded.size(), bf16.size());
  for (size_t i = 0; i < loaded.size(); ++i) {
    EXPECT_EQ(loaded[i].second.scalar_type(), torch::kFloat) << loaded[i].first;
    EXPECT_TRUE(torch::equal(loaded[i].second, bf16[i].second.to(torch::kFloat))) << loaded[i].first;
  }
}

}  // namespace
