// `dflash-host generate` as a user runs it: the real binary on the shipped
// quickstart target, its lines then training a drafter with `dflash-host`,
// and every flag it refuses before a plugin loads.
#include "support/expect.h"
#include "support/host_run.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {
namespace fs = std::filesystem;

using dflash::test::HostRun;
using dflash::test::run_host;

const std::string kConfigs = DFLASH_CONFIGS_DIR;
const std::string kHeldout = kConfigs + "/quickstart/data/heldout.jsonl";

// The quickstart config with paths that hold from any directory.
std::string config_file(const fs::path& dir, const std::string& data_path) {
  std::ifstream in(kConfigs + "/quickstart.json");
  nlohmann::json c = nlohmann::json::parse(in);
  c["target"]["path"] = kConfigs + "/quickstart/target";
  c["data"]["path"] = data_path;
  c["train"]["eval_every"] = 0;
  c["train"]["output_dir"] = (dir / "run").string();
  const std::string file = (dir / "config.json").string();
  std::ofstream(file) << c.dump(2);
  return file;
}

std::vector<nlohmann::json> json_lines(const fs::path& file) {
  std::ifstream in(file);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(GenerateCli, WritesTrainingLinesAndAReportThatTrainADrafter) {
  dflash::test::TempDir temp("dflash_generate_cli");
  const fs::path out = temp.path() / "regenerated.jsonl", report = temp.path() / "report.json";
  const std::string config = config_file(temp.path(), out.string());
  HostRun r = run_host("generate --config " + config + " --prompts " + kHeldout + " --max-prompts 4 --max-new-tokens 16 "
                   "--batch-size 3 --out " + out.string() + " --report " + report.string(), temp.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.out, "generated 4 answers (64 tokens)");
  EXPECT_CONTAINS(r.out, "tokens/s");
  EXPECT_CONTAINS(r.out, "greedy, batch size 3");
  const auto lines = json_lines(out);
  ASSERT_EQ(lines.size(), 4u);
  for (const auto& line : lines) {
    // Held-out lines supervise from their 9th token: the 8 before are the prompt.
    EXPECT_EQ(line.at("prompt_tokens"), 8);
    EXPECT_EQ(line.at("answer_tokens"), 16);
    EXPECT_EQ(line.at("input_ids").size(), 24u);
    EXPECT_EQ(line.at("loss_mask"), nlohmann::json(std::vector<int>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                   1, 1, 1, 1, 1, 1, 1, 1}));
    EXPECT_EQ(line.at("stop"), "max_new_tokens");
  }
  EXPECT_EQ(lines[2].at("prompt_line"), 3);
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("generated_tokens"), 64);
  EXPECT_EQ(j.at("prompt_tokens"), 32);
  EXPECT_GT(j.at("tokens_per_s").get<double>(), 0.0);
  EXPECT_EQ(j.at("batch_size"), 3);
  EXPECT_TRUE(j.at("native_batch_decoding").get<bool>());

  // Another batch size writes the same file.
  const fs::path again = temp.path() / "again.jsonl";
  r = run_host("generate --config " + config + " --prompts " + kHeldout + " --max-prompts 4 --max-new-tokens 16 "
               "--out " + again.string(), temp.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json_lines(again), lines);

  // The lines are training data: a few steps of the quickstart recipe on them.
  r = run_host("--config " + config + " --set train.steps=3 --set train.log_every=1", temp.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json_lines(temp.path() / "run" / "metrics.jsonl").size(), 3u);
}

TEST(GenerateCli, SamplingIsSeededAndReproducible) {
  dflash::test::TempDir temp("dflash_generate_sampling");
  const std::string config = config_file(temp.path(), kHeldout);
  auto sample = [&](const std::string& name, const std::string& flags) {
    const fs::path out = temp.path() / name;
    HostRun r = run_host("generate --config " + config + " --prompts " + kHeldout + " --max-prompts 3 --max-new-tokens 12 "
                     "--temperature 0.8 --top-p 0.9 --out " + out.string() + " " + flags, temp.path());
    EXPECT_EQ(r.status, 0) << r.err;
    return json_lines(out);
  };
  const auto a = sample("a.jsonl", "--seed 4 --batch-size 1");
  EXPECT_EQ(sample("b.jsonl", "--seed 4 --batch-size 3"), a);
  EXPECT_NE(sample("c.jsonl", "--seed 5 --batch-size 3"), a);
}

TEST(GenerateCli, BadFlagsAreRefusedBeforeAnyPluginLoads) {
  dflash::test::TempDir temp("dflash_generate_flags");
  const std::string config = config_file(temp.path(), kHeldout);
  const std::string out = (temp.path() / "out.jsonl").string();
  const std::string base = "generate --config " + config + " --prompts " + kHeldout;
  const std::string missing_folder = (temp.path() / "nowhere" / "out.jsonl").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate --config " + config + " --out " + out, "generate needs prompts: --prompts FILE.jsonl"},
      {base, "generate needs an output file: --out FILE.jsonl"},
      {base + " --out " + out + " --batch-size 65537", "--batch-size 65537: takes a number of sequences from 1 to 65536"},
      {base + " --out " + out + " --temperature nan", "--temperature nan: takes a number from 0 (greedy) to 100"},
      {base + " --out " + out + " --temperature 0.7 --top-p 1.5", "--top-p 1.5: takes a probability above 0 and at most 1"},
      {base + " --out " + out + " --top-p 0.9", "--top-p applies to sampling; add --temperature T"},
      {base + " --out " + out + " --seed 3", "--seed applies to sampling; add --temperature T"},
      {base + " --out " + out + " --temperature 1 --seed -2", "--seed -2: takes a number from 0"},
      {base + " --out " + temp.path().string(), "--out " + temp.path().string() + " is a directory; give a file name"},
      {base + " --out " + missing_folder, "--out " + missing_folder + ": the folder " + (temp.path() / "nowhere").string() +
                                               " does not exist; create it first"},
      {base + " --out " + kHeldout, "--out " + kHeldout + " is the prompts file; write the training lines to another file"},
      {base + " --out " + out + " --report " + out, "--report " + out + " is the --out file"},
      {"generate --config " + config + " --prompts " + temp.path().string() + " --out " + out,
       temp.path().string() + " is a directory, not a prompts file"},
  };
  for (const auto& [args, message] : cases) {
    const HostRun r = run_host(args, temp.path());
    EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
    EXPECT_CONTAINS(r.err, message);
    EXPECT_EQ(r.err.find("loading "), std::string::npos) << "nothing may be loaded first: " << r.err;
  }
  EXPECT_FALSE(fs::exists(out)) << "a refused run writes nothing";
}

TEST(GenerateCli, BadPromptLinesNameTheFileAndLine) {
  dflash::test::TempDir temp("dflash_generate_prompts");
  const std::string config = config_file(temp.path(), kHeldout);
  const fs::path prompts = temp.path() / "prompts.jsonl", out = temp.path() / "out.jsonl";
  auto error_for = [&](const std::string& text, const std::string& flags = "") {
    std::ofstream(prompts) << text;
    const HostRun r = run_host("generate --config " + config + " --prompts " + prompts.string() + " --out " + out.string() + " " + flags,
                           temp.path());
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_FALSE(fs::exists(out)) << "a failed run leaves no output";
    return r.err;
  };
  const std::string at = prompts.string() + ":2: ";
  EXPECT_CONTAINS(error_for("{\"prompt_ids\": [1, 2]}\n{\"prompt_ids\": [300]}\n"),
                  at + "\"prompt_ids\" holds id 300, outside the target's vocabulary [0, 260)");
  EXPECT_CONTAINS(error_for("{\"prompt_ids\": [1]}\n{\"input_ids\": [1, 2], \"loss_mask\": [1, 1]}\n"),
                  at + "\"loss_mask\" supervises the first token, so no prompt precedes the answer");
  EXPECT_CONTAINS(error_for("{\"prompt_ids\": [1]}\n{\"input_ids\": [1, 2], \"loss_mask\": [0]}\n"),
                  at + "\"loss_mask\" has 1 entries, \"input_ids\" 2");
  EXPECT_CONTAINS(error_for("{\"prompt_ids\": [1]}\n{\"prompt_ids\": [1, 2, 3, 4, 5]}\n", "--max-length 5"),
                  at + "the prompt has 5 tokens, not fewer than max_length 5");
}

}  // namespace
