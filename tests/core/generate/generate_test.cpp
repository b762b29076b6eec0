// `dflash-host generate` in process, on the shipped quickstart target: the
// batched decoding slot (ABI 1.3) against one session at a time, the host's
// fallback for targets without it, generation against eval's greedy
// decoding token for token at several batch sizes, seeded sampling, the
// output file's order and atomicity, and the lines loading in the jsonl
// data source.
#include "eval/evaluation.h"
#include "generate/generation.h"
#include "generate/lines_file.h"
#include "generate/output.h"
#include "generate/sampling.h"
#include "plugin/registry.h"
#include "support/expect.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <fstream>
#include <map>
#include <memory>

namespace {
using namespace dflash;
using host::LogitRows;
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

nlohmann::json target_config() {
  return {{"path", kTarget}, {"dtype", "auto"}, {"feature_layers", 2}, {"kernels", "auto"}, {"streams", 2}, {"attention", "auto"}};
}

std::unique_ptr<TargetModelInstance> quickstart_target() {
  return std::make_unique<TargetModelInstance>(registry().find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"), target_config(),
                                               host::InstanceOptions{"cpu", "float32", 0});
}

// The same plugin as a target built before ABI 1.3 presents it: its table
// ends at plan_memory. The slot beyond is left set, so the test also shows
// that the host never reads past struct_size.
std::unique_ptr<TargetModelInstance> target_with_abi_1_2_table() {
  const host::PluginRecord& real = registry().find(DFLASH_KIND_TARGET_MODEL, "hf_decoder");
  static dflash_target_vtable table = *static_cast<const dflash_target_vtable*>(real.descriptor->vtable);
  static dflash_plugin_descriptor descriptor = *real.descriptor;
  table.struct_size = DFLASH_SIZE_THROUGH(dflash_target_vtable, plan_memory);
  descriptor.vtable = &table;
  host::PluginRecord old = real;
  old.descriptor = &descriptor;
  return std::make_unique<TargetModelInstance>(old, target_config(), host::InstanceOptions{"cpu", "float32", 0});
}

const at::Tensor& get(const NamedTensors& out, const std::string& name) {
  for (const auto& [key, t] : out)
    if (key == name) return t;
  throw std::runtime_error("no " + name);
}

// Held-out prompts cut to the given lengths, with the file lines they came from.
std::vector<eval::Prompt> prompts_of_lengths(const std::vector<int64_t>& lengths) {
  eval::EvalSettings s;
  s.prompts_file = kHeldout;
  s.prompt_tokens = 200;
  s.max_prompts = static_cast<int64_t>(lengths.size());
  auto prompts = eval::read_prompts(s, nlohmann::json{{"vocab_size", 260}});
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i].ids.resize(static_cast<size_t>(lengths[i]));
  return prompts;
}

at::Tensor ids(const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong); }

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// ---- the decode_extend_batch slot -------------------------------------------

TEST(BatchDecoding, EachSessionGetsWhatDecodingItAloneGives) {
  auto target = quickstart_target();
  ASSERT_TRUE(target->can_decode_batch());
  const auto prompts = prompts_of_lengths({30, 7, 51, 18});
  const std::vector<int64_t> layers = {1, 4};
  // Twin sessions: one decoded alone, one in the batch. Begun with different
  // capacities and prefilled in between, so the pooled cache grows while
  // earlier rows hold tokens (their contents must move intact).
  std::vector<int64_t> alone, batched;
  for (size_t i = 0; i < prompts.size(); ++i) {
    alone.push_back(target->decode_begin(70 + 30 * static_cast<int64_t>(i)));
    target->decode_extend(alone.back(), ids(prompts[i].ids), {}, false);
    batched.push_back(target->decode_begin(60 + 40 * static_cast<int64_t>(i)));
    target->decode_extend(batched.back(), ids(prompts[i].ids), {}, false);
  }
  const double scale = 20.0;  // the quickstart target's logits are O(10)
  auto expect_same = [&](const std::vector<size_t>& which, const std::vector<std::vector<int64_t>>& tokens) {
    std::vector<int64_t> sessions, flat;
    for (size_t k = 0; k < which.size(); ++k) {
      sessions.push_back(batched[which[k]]);
      flat.insert(flat.end(), tokens[k].begin(), tokens[k].end());
    }
    const auto n = static_cast<int64_t>(tokens[0].size());
    const auto out = target->decode_extend_batch(sessions, ids(flat).view({static_cast<int64_t>(which.size()), n}), layers,
                                                 LogitRows::kAll);
    const at::Tensor& logits = get(out, "logits");
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{static_cast<int64_t>(which.size()), n, 260}));
    for (size_t k = 0; k < which.size(); ++k) {
      const auto own = target->decode_extend(alone[which[k]], ids(tokens[k]), layers, true);
      EXPECT_LE(max_diff(logits[k], get(own, "logits")), 1e-4 * scale) << "session " << which[k];
      for (int64_t layer : layers) {
        const std::string name = "hidden." + std::to_string(layer);
        EXPECT_LE(max_diff(get(out, name)[k], get(own, name)), 1e-4 * scale) << name << ", session " << which[k];
      }
    }
  };
  // One token each, five steps: the sequences' lengths all differ.
  for (int64_t step = 0; step < 5; ++step) expect_same({0, 1, 2, 3}, {{65 + step}, {66}, {101}, {32 + step}});
  // Several tokens each (as a speculative verification would append).
  expect_same({0, 1, 2, 3}, {{10, 11, 12}, {13, 14, 15}, {16, 17, 18}, {19, 20, 21}});
  // A subset, out of row order: the target gathers the rows.
  expect_same({3, 1}, {{40}, {41}});
  expect_same({2}, {{42}});
  // Only the last position's logits: [count, 1, V], the same values.
  const auto all = target->decode_extend_batch({alone[0], alone[1]}, ids({7, 8, 9, 10}).view({2, 2}), {}, LogitRows::kAll);
  const auto last = target->decode_extend_batch({batched[0], batched[1]}, ids({7, 8, 9, 10}).view({2, 2}), {}, LogitRows::kLast);
  ASSERT_EQ(get(last, "logits").sizes(), (std::vector<int64_t>{2, 1, 260}));
  EXPECT_LE(max_diff(get(last, "logits").select(1, 0), get(all, "logits").select(1, 1)), 1e-4 * scale);
  // No logits asked: none computed.
  const auto none = target->decode_extend_batch({batched[0]}, ids({1}).view({1, 1}), {3}, LogitRows::kNone);
  EXPECT_EQ(none.size(), 1u);
  EXPECT_EQ(none.at(0).first, "hidden.3");
  target->decode_extend(alone[0], ids({1}), {}, false);

  // Refusals change nothing: afterwards the twins still agree.
  auto error_of = [&](const std::vector<int64_t>& sessions, const at::Tensor& tokens) {
    try {
      target->decode_extend_batch(sessions, tokens, {}, LogitRows::kAll);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_CONTAINS(error_of({batched[0], batched[0]}, ids({1, 2}).view({2, 1})), "appears twice");
  EXPECT_CONTAINS(error_of({batched[0], 9999}, ids({1, 2}).view({2, 1})), "no decoding session 9999");
  EXPECT_CONTAINS(error_of({batched[0], batched[1]}, ids({1, 2}).view({1, 2})), "tokens must be [sessions, n]");
  EXPECT_CONTAINS(error_of({batched[2]}, ids({1, 999}).view({1, 2})), "outside the vocabulary [0, 260)");
  // The batched twin of session 0 holds 30 + 5 + 3 + 2 + 1 = 41 tokens of its 60;
  // session 1 would fit 20 more, session 0 not, so neither takes them.
  EXPECT_CONTAINS(error_of({batched[1], batched[0]}, torch::zeros({2, 20}, torch::kLong)),
                  "20 more tokens would make 61, beyond the session's max_length 60");
  expect_same({0, 1, 2, 3}, {{50}, {51}, {52}, {53}});
  for (int64_t s : alone) target->decode_end(s);
  for (int64_t s : batched) target->decode_end(s);
}

TEST(BatchDecoding, TargetsWithoutTheSlotAreDecodedOneSessionAtATime) {
  auto old = target_with_abi_1_2_table();
  EXPECT_TRUE(old->can_decode());
  EXPECT_FALSE(old->can_decode_batch()) << "an ABI 1.2 table ends before decode_extend_batch";
  auto native = quickstart_target();
  const auto prompts = prompts_of_lengths({12, 25});
  std::vector<int64_t> a, b;
  for (const auto& p : prompts) {
    a.push_back(old->decode_begin(64));
    old->decode_extend(a.back(), ids(p.ids), {}, false);
    b.push_back(native->decode_begin(64));
    native->decode_extend(b.back(), ids(p.ids), {}, false);
  }
  for (auto rows : {LogitRows::kAll, LogitRows::kLast}) {
    const auto x = old->decode_extend_batch(a, ids({5, 6, 7, 8}).view({2, 2}), {2}, rows);
    const auto y = native->decode_extend_batch(b, ids({5, 6, 7, 8}).view({2, 2}), {2}, rows);
    EXPECT_EQ(get(x, "logits").sizes(), get(y, "logits").sizes());
    EXPECT_LE(max_diff(get(x, "logits"), get(y, "logits")), 2e-3);
    EXPECT_EQ(get(x, "hidden.2").sizes(), (std::vector<int64_t>{2, 2, 192}));
    EXPECT_LE(max_diff(get(x, "hidden.2"), get(y, "hidden.2")), 2e-3);
  }
}

// On a GPU in bf16 the batched step runs our kernels between the GEMMs
// (RMSNorm, q/k norm + RoPE, SwiGLU): it must agree with the ATen reference
// path within bf16 rounding, one token per session and several.
TEST(BatchDecoding, CudaKernelsAgreeWithTheReferencePath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto& record = registry().find(DFLASH_KIND_TARGET_MODEL, "hf_decoder");
  auto on_gpu = [&](const char* kernels) {
    nlohmann::json config = target_config();
    config["kernels"] = kernels;
    return std::make_unique<TargetModelInstance>(record, config, host::InstanceOptions{"cuda", "bfloat16", 0});
  };
  auto fast = on_gpu("auto"), reference = on_gpu("aten");
  if (!fast->describe().at("cuda_kernels").get<bool>()) GTEST_SKIP() << "this build has no CUDA kernels";
  const auto prompts = prompts_of_lengths({30, 7, 51, 18});
  std::vector<int64_t> a, b, pending;
  for (const auto& p : prompts) {
    a.push_back(fast->decode_begin(80));
    b.push_back(reference->decode_begin(80));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    fast->decode_extend_batch({a[i]}, ids(prompts[i].ids).view({1, -1}), {}, LogitRows::kLast);
    const auto out = reference->decode_extend_batch({b[i]}, ids(prompts[i].ids).view({1, -1}), {}, LogitRows::kLast);
    pending.push_back(get(out, "logits").argmax(-1).item<int64_t>());
  }
  for (int64_t step = 0; step < 6; ++step) {
    const at::Tensor tokens = step == 5 ? ids({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}).view({4, 3}) : ids(pending).view({4, 1});
    const auto x = get(fast->decode_extend_batch(a, tokens, {}, LogitRows::kAll), "logits").to(torch::kFloat);
    const auto y = get(reference->decode_extend_batch(b, tokens, {}, LogitRows::kAll), "logits").to(torch::kFloat);
    EXPECT_LE(max_diff(x, y), 3e-2 * y.abs().max().item<double>()) << "step " << step;
    const auto next = y.select(1, y.size(1) - 1).argmax(-1).cpu();
    for (size_t i = 0; i < pending.size(); ++i) pending[i] = next[static_cast<int64_t>(i)].item<int64_t>();
  }
}

// ---- generation against eval's greedy decoding --------------------------------

struct Generated {
  std::map<size_t, generate::Answer> answers;
  generate::GenerateStats stats;
};

Generated run_generate(const TargetModelInstance& target, const std::vector<eval::Prompt>& prompts, generate::GenerateSettings s) {
  Generated run;
  run.stats = generate::generate(target, prompts, "prompts.jsonl", s, [&](generate::Answer&& a) {
    EXPECT_EQ(run.answers.count(a.prompt_index), 0u) << "prompt " << a.prompt_index << " answered twice";
    run.answers[a.prompt_index] = std::move(a);
  });
  return run;
}

TEST(Generate, GreedyAnswersAreEvalsGreedyDecodingAtEveryBatchSize) {
  auto target = quickstart_target();
  const auto prompts = prompts_of_lengths({64, 17, 101, 33, 5});
  generate::GenerateSettings s;
  s.limits.max_new_tokens = 24;
  s.limits.eos_token_ids = {257};
  // The quickstart target never emits its EOS greedily, so a token of the
  // first prompt's greedy answer is declared end-of-sequence (eval's test
  // does the same); and max_length cuts the 101-token prompt at 10 tokens.
  const auto first = eval::greedy_decode(*target, prompts[0].ids, s.limits).tokens;
  s.limits.eos_token_ids = {first[6]};
  s.limits.max_length = 111;
  std::vector<eval::Generation> expected;
  for (const auto& p : prompts) expected.push_back(eval::greedy_decode(*target, p.ids, s.limits));
  std::set<std::string> reasons;
  for (const auto& g : expected) reasons.insert(g.stop_reason);
  EXPECT_EQ(reasons, (std::set<std::string>{"eos", "max_length", "max_new_tokens"})) << "every way to stop is exercised";

  for (auto [which, batch] : std::vector<std::pair<const char*, int64_t>>{{"native", 1}, {"native", 2}, {"native", 5},
                                                                          {"native", 8}, {"old", 3}}) {
    SCOPED_TRACE(std::string(which) + " target, batch size " + std::to_string(batch));
    s.batch_size = batch;
    auto old = std::string(which) == "old" ? target_with_abi_1_2_table() : nullptr;
    const Generated run = run_generate(old ? *old : *target, prompts, s);
    ASSERT_EQ(run.answers.size(), prompts.size());
    int64_t generated = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(run.answers.at(i).tokens, expected[i].tokens) << "prompt " << i;
      EXPECT_EQ(run.answers.at(i).stop_reason, expected[i].stop_reason) << "prompt " << i;
      generated += static_cast<int64_t>(expected[i].tokens.size());
    }
    EXPECT_EQ(run.stats.prompts, 5);
    EXPECT_EQ(run.stats.generated_tokens, generated);
    EXPECT_EQ(run.stats.prompt_tokens, 64 + 17 + 101 + 33 + 5);
    EXPECT_EQ(run.stats.prefills, 5);
    EXPECT_EQ(run.stats.native_batch, old == nullptr);
    // Each decoding step adds one token to every sequence in the batch.
    EXPECT_EQ(run.stats.step_rows, generated - 5);
    EXPECT_LE(run.stats.step_rows, run.stats.steps * std::min<int64_t>(batch, 5));
    if (batch >= 5) EXPECT_EQ(run.stats.steps, 23) << "all together: as many steps as the longest answer, less its prefill token";
  }
}

TEST(Generate, SeededSamplingIsReproducibleWhateverTheBatch) {
  auto target = quickstart_target();
  const auto prompts = prompts_of_lengths({40, 12, 70, 25});
  generate::GenerateSettings s;
  s.limits.max_new_tokens = 20;
  s.sampling = {0.9, 0.95, 11};
  auto tokens_of = [&](int64_t batch, uint64_t seed) {
    s.batch_size = batch;
    s.sampling.seed = seed;
    std::vector<std::vector<int64_t>> out;
    for (auto& [i, a] : run_generate(*target, prompts, s).answers) out.push_back(a.tokens);
    return out;
  };
  const auto one = tokens_of(1, 11);
  EXPECT_EQ(tokens_of(3, 11), one) << "another batch size, the same draws for each prompt";
  EXPECT_EQ(tokens_of(4, 11), one);
  EXPECT_EQ(tokens_of(3, 11), one) << "the same seed again";
  EXPECT_NE(tokens_of(3, 12), one) << "another seed";
  s.sampling = {};
  s.batch_size = 4;
  std::vector<std::vector<int64_t>> greedy;
  for (auto& [i, a] : run_generate(*target, prompts, s).answers) greedy.push_back(a.tokens);
  EXPECT_NE(greedy, one) << "sampling at temperature 0.9 samples";
}

TEST(Generate, PromptsThatCannotBeAnsweredAreNamedBeforeAnyIsGenerated) {
  auto target = quickstart_target();
  auto prompts = prompts_of_lengths({10, 40});
  generate::GenerateSettings s;
  s.limits.max_length = 32;
  try {
    run_generate(*target, prompts, s);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "prompts.jsonl:" + std::to_string(prompts[1].line) +
                                  ": the prompt has 40 tokens, not fewer than max_length 32");
  }
}

// ---- sampling ---------------------------------------------------------------

TEST(Sampling, EachDrawPicksTheTokenWhoseProbabilityItFallsIn) {
  const at::Tensor logits = torch::tensor({0.5, 0.3, 0.2}, torch::kDouble).log().unsqueeze(0).expand({4, 3}).contiguous();
  generate::Sampling plain{1.0, 1.0, 0};
  EXPECT_EQ(generate::choose_tokens(logits, plain, {0.0, 0.49, 0.51, 0.9}), (std::vector<int64_t>{0, 0, 1, 2}));
  // top_p 0.6 keeps {0.5, 0.3} (the probability before 0.3 is 0.5 < 0.6), renormalised to 0.8.
  generate::Sampling nucleus{1.0, 0.6, 0};
  EXPECT_EQ(generate::choose_tokens(logits, nucleus, {0.0, 0.6, 0.7, 0.999}), (std::vector<int64_t>{0, 0, 1, 1}));
  // Greedy ignores draws; ties go to the first token, as eval's argmax.
  EXPECT_EQ(generate::choose_tokens(torch::tensor({{1.0, 3.0, 3.0}}), generate::Sampling{}, {}), (std::vector<int64_t>{1}));
  // Frequencies over many draws follow the distribution at temperature 2: p ∝ √(0.5, 0.3, 0.2).
  generate::PromptRandom random(5, 0);
  std::vector<double> draws(30000);
  for (double& u : draws) u = random.next();
  const auto chosen = generate::choose_tokens(logits.narrow(0, 0, 1).expand({30000, 3}).contiguous(), {2.0, 1.0, 0}, draws);
  std::vector<double> counts(3, 0);
  for (int64_t t : chosen) counts[static_cast<size_t>(t)] += 1.0 / 30000;
  const double z = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.2);
  EXPECT_NEAR(counts[0], std::sqrt(0.5) / z, 0.01);
  EXPECT_NEAR(counts[1], std::sqrt(0.3) / z, 0.01);
  EXPECT_NEAR(counts[2], std::sqrt(0.2) / z, 0.01);
}

TEST(Sampling, StreamsDependOnTheSeedAndThePromptOnly) {
  generate::PromptRandom a(7, 3), b(7, 3), c(7, 4), d(8, 3);
  const double first = a.next();
  EXPECT_EQ(first, b.next());
  EXPECT_NE(first, c.next());
  EXPECT_NE(first, d.next());
  for (int i = 0; i < 1000; ++i) {
    const double u = a.next();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

// ---- the output file ------------------------------------------------------------

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(LinesFile, LinesLandInOrderAndOnlyAWholeFileReplacesTheOldOne) {
  test::TempDir temp("dflash_lines");
  const std::string path = (temp.path() / "out.jsonl").string();
  std::ofstream(path) << "old\n";
  {
    generate::LinesFile file(path);
    file.add(2, "c");
    file.add(0, "a");
    EXPECT_EQ(lines_of(file.temporary_path()), (std::vector<std::string>{"a"})) << "held until line 1 arrives";
    file.add(1, "b");
    EXPECT_THROW(file.add(1, "again"), std::logic_error);
    EXPECT_EQ(lines_of(path), (std::vector<std::string>{"old"})) << "untouched before commit";
    EXPECT_THROW(file.commit(4), std::logic_error) << "line 3 is missing";
  }
  EXPECT_EQ(lines_of(path), (std::vector<std::string>{"old"})) << "a run that failed leaves the old file";
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp-" + std::to_string(::getpid()))) << "and no temporary file";
  {
    generate::LinesFile file(path);
    for (size_t i : {1, 0, 3, 2}) file.add(i, std::string(1, static_cast<char>('w' + i)));
    file.commit(4);
  }
  EXPECT_EQ(lines_of(path), (std::vector<std::string>{"w", "x", "y", "z"}));
}

TEST(Generate, OutputLinesAreTrainingDataTheJsonlSourceReads) {
  auto target = quickstart_target();
  const auto prompts = prompts_of_lengths({20, 9, 33});
  generate::GenerateSettings s;
  s.limits.max_new_tokens = 12;
  s.batch_size = 2;
  test::TempDir temp("dflash_generate_lines");
  const std::string path = (temp.path() / "regenerated.jsonl").string();
  int64_t answer_tokens = 0;
  {
    generate::LinesFile file(path);
    generate::generate(*target, prompts, kHeldout, s, [&](generate::Answer&& a) {
      answer_tokens += static_cast<int64_t>(a.tokens.size());
      file.add(a.prompt_index, generate::training_line(prompts[a.prompt_index], a));
    });
    file.commit(prompts.size());
  }
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto j = nlohmann::json::parse(lines[i]);
    const auto input = j.at("input_ids").get<std::vector<int64_t>>();
    const auto mask = j.at("loss_mask").get<std::vector<int64_t>>();
    ASSERT_EQ(input.size(), prompts[i].ids.size() + 12);
    EXPECT_TRUE(std::equal(prompts[i].ids.begin(), prompts[i].ids.end(), input.begin())) << "the prompt comes first";
    EXPECT_EQ(mask, [&] {
      std::vector<int64_t> m(prompts[i].ids.size(), 0);
      m.resize(input.size(), 1);
      return m;
    }()) << "prompt masked, answer supervised";
    EXPECT_EQ(j.at("stop"), "max_new_tokens");
    EXPECT_EQ(j.at("prompt_line"), prompts[i].line);
    EXPECT_EQ(j.at("prompt_tokens"), prompts[i].ids.size());
    EXPECT_EQ(j.at("answer_tokens"), 12);
  }
  // The jsonl source takes every line, and supervises exactly the answers.
  host::DataSourceInstance data(registry().find(DFLASH_KIND_DATA_SOURCE, "jsonl"),
                                {{"path", path}, {"vocab_size", 260}, {"row_length", 128}, {"tokens_per_batch", 256},
                                 {"shuffle", false}, {"epochs", 1}, {"on_bad_line", "stop"}, {"long_sequences", "skip"},
                                 {"log_bad_lines", 10}},
                                host::InstanceOptions{"cpu", "float32", 0});
  int64_t supervised = 0;
  while (auto batch = data.next_batch()) supervised += get(*batch, "loss_mask").sum().item<int64_t>();
  EXPECT_EQ(supervised, answer_tokens);
  const auto facts = *data.describe();
  EXPECT_EQ(facts.at("sequences_used"), 3);
  EXPECT_EQ(facts.at("bad_lines"), 0);
}

}  // namespace
