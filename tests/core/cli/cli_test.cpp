// dflash-host as a user runs it: the real binary, real plugin directories,
// real config files. Asserts exit codes and the messages users read.
#include "support/expect.h"
#include "support/temp_dir.h"

#include <dflash/abi.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

struct HostRun {
  int status;
  std::string out;  // stdout
  std::string err;  // stderr
  int raw = 0;      // pclose's wait status
};

// Runs a shell command line (cd, environment, then dflash-host) with stdout
// and stderr captured.
HostRun shell(const std::string& command_line) {
  static int counter = 0;
  const fs::path err_file = fs::temp_directory_path() / ("dflash_cli_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  const std::string command = "{ " + command_line + "; } 2>" + err_file.string();
  HostRun run{};
  FILE* pipe = popen(command.c_str(), "r");
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) run.out.append(buffer.data(), n);
  const int raw = pclose(pipe);
  run.raw = raw;
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream err(err_file);
  run.err.assign(std::istreambuf_iterator<char>(err), {});
  fs::remove(err_file);
  return run;
}

HostRun host(const std::string& args) {
  return shell(std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs " + args);
}

// A run that died of `signal`: killed by it, or, where the shell outlived
// its child, the shell's exit status 128 + signal.
bool died_of(const HostRun& r, int signal) {
  return (WIFSIGNALED(r.raw) && WTERMSIG(r.raw) == signal) || (WIFEXITED(r.raw) && WEXITSTATUS(r.raw) == 128 + signal);
}

const std::string kGood = std::string(" --plugin-dir ") + DFLASH_GOOD_PLUGIN_DIR;
const std::string kBroken = std::string(" --plugin-dir ") + DFLASH_BROKEN_PLUGIN_DIR;

fs::path write_config(const std::string& name, const std::string& text) {
  const fs::path file = fs::temp_directory_path() / ("dflash_cli_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(file) << text;
  return file;
}


TEST(Cli, HelpListsCommandsAndFlags) {
  HostRun r = host("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* fragment : {"train", "list", "describe NAME", "config", "--plugin-dir", "--set", "--loss",
                               "--scheduler", "--log-level", "--config"})
    EXPECT_CONTAINS(r.out, fragment);
}

TEST(Cli, VersionNamesAbiAndLibTorch) {
  HostRun r = host("--version");
  EXPECT_EQ(r.status, 0);
  EXPECT_CONTAINS(r.out, "plugin ABI 1." + std::to_string(DFLASH_ABI_MINOR));
  EXPECT_CONTAINS(r.out, "LibTorch ");
}

TEST(Cli, ListShowsPluginsAndSkippedLibrariesWithReasons) {
  HostRun r = host("list" + kGood + kBroken);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.out, "KIND");
  EXPECT_CONTAINS(r.out, "test_loss");
  EXPECT_CONTAINS(r.out, "2.3.4");
  EXPECT_CONTAINS(r.out, "c_data");
  EXPECT_CONTAINS(r.out, "libtest_plugins.so");
  EXPECT_CONTAINS(r.out, "skipped");
  EXPECT_CONTAINS(r.out, "not a shared object");
  EXPECT_CONTAINS(r.out, "newer than this host's ABI 1." + std::to_string(DFLASH_ABI_MINOR));
}

TEST(Cli, ListJsonParses) {
  HostRun r = host("list --json" + kGood);
  ASSERT_EQ(r.status, 0) << r.err;
  auto json = nlohmann::json::parse(r.out);
  bool found = false;
  for (const auto& plugin : json.at("plugins"))
    found = found || (plugin.at("name") == "test_drafter" && plugin.at("kind") == "drafter");
  EXPECT_TRUE(found) << r.out;
}

TEST(Cli, DescribePrintsConfigWithDefaults) {
  HostRun r = host("describe test_data" + kGood);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.out, "data source plugin 'test_data'");
  EXPECT_CONTAINS(r.out, "batches");
  EXPECT_CONTAINS(r.out, "tokens per row");
  EXPECT_CONTAINS(r.out, "\"plugin\": \"test_data\"");
  HostRun host_section = host("describe host");
  EXPECT_EQ(host_section.status, 0);
  EXPECT_CONTAINS(host_section.out, "train.seed");
}

TEST(Cli, DescribeUnknownNameListsWhatExists) {
  HostRun r = host("describe nope" + kGood);
  EXPECT_EQ(r.status, 2);
  EXPECT_CONTAINS(r.err, "no plugin named 'nope'");
  EXPECT_CONTAINS(r.err, "loss/test_loss");
}

TEST(Cli, ConfigResolvesDefaultsAndOverrides) {
  const fs::path file = write_config("ok.json", R"({"train": {"seed": 3}, "loss": {"plugin": "test_loss"}})");
  HostRun r = host("config --config " + file.string() + " --set loss.scale=4 --scheduler test_schedule" + kGood);
  ASSERT_EQ(r.status, 0) << r.err;
  auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json.at("train").at("seed"), 3);
  EXPECT_EQ(json.at("train").at("device"), "cpu") << "host defaults are filled";
  EXPECT_EQ(json.at("loss").at("scale"), 4.0);
  EXPECT_EQ(json.at("scheduler").at("plugin"), "test_schedule");
  EXPECT_EQ(json.at("scheduler").at("factor"), 0.5) << "plugin defaults are filled";
}

TEST(Cli, ConfigErrorsNameThePathAndThePlugin) {
  const fs::path file = write_config("bad.json", R"({"loss": {"plugin": "test_loss", "scael": 2}})");
  HostRun unknown = host("config --config " + file.string() + kGood);
  EXPECT_EQ(unknown.status, 2);
  EXPECT_CONTAINS(unknown.err, "loss.scael");
  EXPECT_CONTAINS(unknown.err, "scale");
  EXPECT_CONTAINS(unknown.err, "test_loss");

  HostRun type = host("config --loss test_loss --set loss.scale=\\\"big\\\"" + kGood);
  EXPECT_EQ(type.status, 2);
  EXPECT_CONTAINS(type.err, "loss.scale");

  HostRun range = host("config --loss test_loss --set loss.scale=-1" + kGood);
  EXPECT_EQ(range.status, 2);
  EXPECT_CONTAINS(range.err, "loss.scale");

  HostRun missing_plugin = host("config --loss fused_ckpt_kl" + kGood);
  EXPECT_EQ(missing_plugin.status, 2);
  EXPECT_CONTAINS(missing_plugin.err, "no loss plugin named 'fused_ckpt_kl'");
  EXPECT_CONTAINS(missing_plugin.err, "test_loss");

  HostRun no_file = host("config --config /nonexistent/run.json" + kGood);
  EXPECT_EQ(no_file.status, 2);
  EXPECT_CONTAINS(no_file.err, "/nonexistent/run.json");

  const fs::path syntax = write_config("syntax.json", "{\n  \"train\": {\"seed\": 1,}\n}\n");
  HostRun parse = host("config --config " + syntax.string() + kGood);
  EXPECT_EQ(parse.status, 2);
  EXPECT_CONTAINS(parse.err, syntax.string());
  EXPECT_CONTAINS(parse.err, "line 2");
}

// Any five plugins that honour the ABI train together: here the test
// plugins (a linear drafter over a fixed target), not the in-tree ones.
TEST(Cli, EvalDecodesLosslesslyAndWritesItsReport) {
  const std::string configs = DFLASH_CONFIGS_DIR;
  const fs::path config = write_config("eval.json", R"({"train": {"device": "cpu", "dtype": "float32"},
    "target": {"plugin": "hf_decoder", "path": ")" + configs + R"(/quickstart/target"},
    "drafter": {"plugin": "prompt_lookup", "block_size": 6}})");
  const fs::path report = fs::temp_directory_path() / ("dflash_cli_report_" + std::to_string(::getpid()) + ".json");
  const std::string base = "eval --plugin-dir " + std::string(DFLASH_INTREE_PLUGIN_DIR) + " --config " + config.string();
  HostRun r = host(base + " --prompts " + configs + "/quickstart/data/heldout.jsonl --max-prompts 3 --max-new-tokens 24 --report " +
                   report.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.out, "drafter prompt_lookup, block size 6, 3 prompts, up to 24 new tokens each");
  EXPECT_CONTAINS(r.out, "mean acceptance length τ");
  EXPECT_CONTAINS(r.out, "lossless                   yes (3 of 3 outputs identical");
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("prompts"), 3);
  EXPECT_TRUE(j.at("lossless").get<bool>());
  EXPECT_TRUE(j.at("lossless_up_to_ties").get<bool>());
  EXPECT_EQ(j.at("identical_prompts"), 3);
  EXPECT_EQ(j.at("near_tie_divergences"), 0);
  EXPECT_EQ(j.at("other_divergences"), 0);
  EXPECT_FALSE(j.contains("near_tie_bound")) << "no divergence was measured";
  EXPECT_GE(j.at("tau_mean").get<double>(), 1.0);
  EXPECT_EQ(j.at("acceptance_by_position").size(), 5u);
  ASSERT_EQ(j.at("per_prompt").size(), 3u);
  for (const auto& row : j.at("per_prompt")) {
    EXPECT_EQ(row.at("generated"), 24);
    EXPECT_EQ(row.at("tokens").size(), 24u);
    EXPECT_TRUE(row.at("identical_to_greedy").get<bool>());
    EXPECT_FALSE(row.contains("divergence"));
  }
  // Beside the report, its TensorBoard file: the report's numbers but the
  // per-prompt details, read by the independent reader where it is installed.
  const fs::path events = report.parent_path() / ("events.out.tfevents.eval." + report.stem().string());
  ASSERT_TRUE(fs::exists(events)) << events;
  EXPECT_CONTAINS(r.out, "TensorBoard: " + events.string());
  if (std::system("command -v protoc > /dev/null 2>&1 && /usr/bin/python3 -c 'import crc32c' 2>/dev/null") == 0) {
    const fs::path decoded = fs::path(report).replace_extension(".events.json");
    ASSERT_EQ(std::system(("/usr/bin/python3 " + std::string(DFLASH_SOURCE_DIR) + "/tests/core/metrics/read_tfevents.py " +
                           events.string() + " > " + decoded.string()).c_str()),
              0);
    std::ifstream read(decoded);
    const auto e = nlohmann::json::parse(read);
    ASSERT_EQ(e.at("steps").size(), 1u);
    const nlohmann::json& values = e.at("steps")[0][2];
    EXPECT_NEAR(values.at("eval/tau_mean").get<double>(), j.at("tau_mean").get<double>(), 1e-5);
    EXPECT_EQ(values.at("eval/identical_prompts").get<double>(), 3.0);
    EXPECT_NEAR(values.at("eval/acceptance_by_position/0").get<double>(), j.at("acceptance_by_position")[0].get<double>(), 1e-6);
    for (const auto& [tag, value] : values.items()) EXPECT_EQ(tag.find("per_prompt"), std::string::npos) << tag;
    fs::remove(decoded);
  }
  fs::remove(report);
  fs::remove(events);

  r = host(base);
  EXPECT_EQ(r.status, 2);
  EXPECT_CONTAINS(r.err, "eval needs held-out prompts: --prompts FILE.jsonl");
  r = host(base + " --prompts " + configs + "/quickstart/data/heldout.jsonl --drafter-checkpoint /nonexistent/run");
  EXPECT_EQ(r.status, 2);
  EXPECT_CONTAINS(r.err, "/nonexistent/run: not a drafter directory");
}

// A DDTree budget sweep beside the chain in one run: one report per arm and
// their comparison, the target alone decoding each prompt once for all.
TEST(Cli, EvalComparesTheChainAndTreeBudgetsInOneRun) {
  const std::string configs = DFLASH_CONFIGS_DIR;
  const fs::path config = write_config("eval_arms.json", R"({"train": {"device": "cpu", "dtype": "float32"},
    "target": {"plugin": "hf_decoder", "path": ")" + configs + R"(/quickstart/target"},
    "drafter": {"plugin": "dflash", "num_layers": 2, "block_size": 8, "max_anchors": 48, "mask_token_id": 259}})");
  dflash::test::TempDir temp("dflash_cli_eval_arms");
  const fs::path report = temp.path() / "sweep.json";
  HostRun r = host("eval --plugin-dir " + std::string(DFLASH_INTREE_PLUGIN_DIR) + " --config " + config.string() +
                   " --prompts " + configs + "/quickstart/data/heldout.jsonl --max-prompts 2 --max-new-tokens 16" +
                   " --verify chain,tree --tree-nodes 4,8 --tree-temperature 1,0.5 --draft-tokens 3 --report " + report.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.out, "drafter dflash, block size 4, 2 prompts");  // --draft-tokens: the chain's
  EXPECT_CONTAINS(r.out, "block size 8, draft trees of 4 nodes");
  EXPECT_CONTAINS(r.out, "block size 8, draft trees of 8 nodes,");
  EXPECT_CONTAINS(r.out, "block size 8, draft trees of 4 nodes at temperature 0.5,");
  EXPECT_CONTAINS(r.out, "arms compared (ratios to the first arm, chain)");
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j.at("arms").size(), 5u);
  ASSERT_EQ(j.at("comparison").size(), 5u);
  // Temperatures outer, budgets inner.
  const std::tuple<const char*, int64_t, double> arms[] = {
      {"chain", 0, 1.0}, {"tree", 4, 1.0}, {"tree", 8, 1.0}, {"tree", 4, 0.5}, {"tree", 8, 0.5}};
  for (size_t i = 0; i < 5; ++i) {
    const nlohmann::json &arm = j.at("arms")[i], &entry = j.at("comparison")[i];
    EXPECT_EQ(arm.at("verify"), std::get<0>(arms[i]));
    EXPECT_EQ(arm.at("tree_nodes"), std::get<1>(arms[i]));
    EXPECT_EQ(arm.at("tree_temperature"), std::get<2>(arms[i]));
    EXPECT_EQ(entry.at("tree_temperature"), std::get<2>(arms[i]));
    EXPECT_EQ(arm.at("per_prompt").size(), 2u);
    EXPECT_TRUE(arm.at("lossless").get<bool>()) << arm.dump();
    EXPECT_EQ(arm.at("greedy_tokens_per_s"), j.at("arms")[0].at("greedy_tokens_per_s")) << "one baseline for every arm";
    EXPECT_EQ(entry.at("verify"), std::get<0>(arms[i]));
    EXPECT_EQ(entry.at("tau_mean"), arm.at("tau_mean"));
    EXPECT_EQ(entry.at("speedup"), arm.at("speedup"));
    EXPECT_TRUE(entry.at("lossless").get<bool>());
    EXPECT_DOUBLE_EQ(entry.at("tau_ratio_to_first").get<double>(),
                     arm.at("tau_mean").get<double>() / j.at("arms")[0].at("tau_mean").get<double>());
    EXPECT_CONTAINS(r.out, "\n  " + entry.at("arm").get<std::string>() + " ");
  }
  EXPECT_EQ(j.at("comparison")[1].at("arm"), "tree 4");
  EXPECT_EQ(j.at("comparison")[3].at("arm"), "tree 4 T=0.5");
  // The TensorBoard file names each arm in its tags.
  const fs::path events = temp.path() / "events.out.tfevents.eval.sweep";
  ASSERT_TRUE(fs::exists(events)) << events;
  std::ifstream event_file(events, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(event_file)), {});
  for (const char* tag : {"eval/chain/tau_mean", "eval/tree4/tau_mean", "eval/tree8/speedup", "eval/tree8_t0.5/tau_mean"})
    EXPECT_NE(bytes.find(tag), std::string::npos) << tag;
}

// In-process plugins can crash the host; the host's last words name the
// library (the crashing plugins live outside the folders other tests scan).
TEST(Cli, PluginThatCrashesWhileLoadingIsNamedBeforeTheHostDies) {
  const std::pair<const char*, int> cases[] = {{"abort_at_load", SIGABRT}, {"crash_in_entry", SIGSEGV}};
  for (const auto& [name, sig] : cases) {
    const fs::path dir = fs::path(DFLASH_CRASHING_PLUGIN_DIR) / name;
    const std::string file = fs::weakly_canonical(dir / ("lib" + std::string(name) + ".so")).string();
    for (const char* command : {"list", "config"}) {
      HostRun r = shell("ulimit -c 0; " + std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs " + command +
                        " --plugin-dir " + dir.string());
      EXPECT_TRUE(died_of(r, sig)) << name << " " << command << ": wait status " << r.raw << "\n" << r.err;
      EXPECT_CONTAINS(r.err, "loading " + file);
      EXPECT_CONTAINS(r.err, "dflash-host: crashed while loading plugin library " + file + " (" +
                                 (sig == SIGABRT ? "SIGABRT" : "SIGSEGV"));
      EXPECT_CONTAINS(r.err, "in-process plugins can crash the host: fix the plugin, or move its library out of the plugin "
                             "directories");
    }
  }
}

TEST(Cli, WorldWritablePluginsAreWarnedAboutUnlessAllowed) {
  dflash::test::TempDir temp("dflash_cli_ww");
  const fs::path dir = temp.folder("plugins");
  const fs::path file = dir / "libtwin_a.so";
  fs::copy_file(fs::path(DFLASH_BROKEN_PLUGIN_DIR) / "twin_a" / "libtwin_a.so", file);
  const std::string list = "list --plugin-dir " + dir.string();
  // Private folder and file (the temp root, /tmp, is sticky): no warning.
  ::chmod(dir.c_str(), 0755);
  ::chmod(file.c_str(), 0644);
  HostRun r = host(list);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.out, "twin");
  EXPECT_EQ(r.err.find("world-writable"), std::string::npos) << r.err;
  // A folder anyone can drop a library into.
  ::chmod(dir.c_str(), 0777);
  r = host(list);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.out, "twin") << "a warning, not a refusal";
  EXPECT_CONTAINS(r.err, "plugin directory " + dir.string() + " is world-writable: any user can put a library there");
  EXPECT_CONTAINS(r.err, "chmod o-w " + dir.string());
  EXPECT_CONTAINS(r.err, "--allow-world-writable-plugins");
  // A library anyone can overwrite.
  ::chmod(dir.c_str(), 0755);
  ::chmod(file.c_str(), 0666);
  r = host(list);
  EXPECT_CONTAINS(r.err, "plugin library " + file.string() + " is world-writable: any user can replace the code");
  EXPECT_CONTAINS(r.err, "chmod o-w " + file.string());
  // The flag silences both.
  ::chmod(dir.c_str(), 0777);
  r = host(list + " --allow-world-writable-plugins");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.find("world-writable"), std::string::npos) << r.err;
  EXPECT_CONTAINS(host("--help").out, "--allow-world-writable-plugins");
}

TEST(Cli, RelativePluginPathEntriesAreTakenAgainstTheCurrentDirectoryAndLoggedAbsolute) {
  dflash::test::TempDir temp("dflash_cli_pp");
  const fs::path work = temp.folder("work");
  const fs::path plugins = temp.folder("work/plugins");
  fs::copy_file(fs::path(DFLASH_BROKEN_PLUGIN_DIR) / "twin_a" / "libtwin_a.so", plugins / "libtwin_a.so");
  const std::string exe = std::string(DFLASH_HOST_EXE);
  HostRun r = shell("cd " + work.string() + " && DFLASH_PLUGIN_PATH=plugins " + exe + " list");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.out, "twin");
  EXPECT_CONTAINS(r.err, "$DFLASH_PLUGIN_PATH entry 'plugins' is relative: taken against the current directory, " +
                             plugins.string());
  EXPECT_CONTAINS(r.err, "plugin directory " + plugins.string() + ": 1 library");
  EXPECT_CONTAINS(r.err, "loading " + (plugins / "libtwin_a.so").string());
  // From another directory the same entry names another folder, and the error says which.
  r = shell("cd " + temp.path().string() + " && DFLASH_PLUGIN_PATH=plugins " + exe + " list");
  EXPECT_EQ(r.status, 2);
  EXPECT_CONTAINS(r.err, "$DFLASH_PLUGIN_PATH entry 'plugins' is not a directory (" + (temp.path() / "plugins").string() +
                             ", relative entries are taken against the current directory)");
}

// eval's numbers and paths are checked before anything is loaded: a typo
// costs a moment, not a model load and a whole evaluation.
TEST(Cli, EvalChecksItsNumbersAndPathsFirst) {
  const std::string configs = DFLASH_CONFIGS_DIR;
  const std::string prompts = configs + "/quickstart/data/heldout.jsonl";
  const std::string command = "eval --plugin-dir " + std::string(DFLASH_INTREE_PLUGIN_DIR) + " --config " + configs +
                              "/quickstart-prompt-lookup.json";
  const std::pair<const char*, const char*> numbers[] = {
      {"--max-new-tokens 9223372036854775807", "--max-new-tokens 9223372036854775807: takes a number of tokens from 1 to 16777216"},
      {"--max-new-tokens 0", "--max-new-tokens 0: takes a number of tokens from 1 to 16777216"},
      {"--max-length 1", "--max-length 1: takes a number of tokens from 2 to 16777216"},
      {"--prompt-tokens 16777217", "--prompt-tokens 16777217: takes a number of tokens from 1 to 16777216"},
      {"--max-prompts 4294967296", "--max-prompts 4294967296: takes a number of prompts from 1 to 16777216"},
      {"--verify forest", "--verify forest: takes chain, tree or chain,tree"},
      {"--verify tree", "--verify tree needs --tree-nodes N"},
      {"--tree-nodes 8", "--tree-nodes sizes a draft tree: it needs --verify tree"},
      {"--verify tree --tree-nodes 0", "--tree-nodes 0: takes a number of nodes from 1 to 16777216"},
      {"--verify tree --tree-nodes 16777217", "--tree-nodes 16777217: takes a number of nodes from 1 to 16777216"},
      {"--draft-tokens 0", "--draft-tokens 0: takes a number of tokens from 1 to 16777216"},
      {"--verify tree --tree-nodes 8 --draft-tokens 3", "--draft-tokens sets a chain's length; a draft tree's size is --tree-nodes"},
      // Lists: several arms in one run, each item named when it is wrong.
      {"--verify chain,fast", "--verify chain,fast: takes chain, tree or chain,tree"},
      {"--verify chain,chain", "--verify chain,chain: chain is listed twice; takes chain, tree or chain,tree"},
      {"--verify chain,", "--verify chain,: takes chain, tree or chain,tree"},
      {"--verify chain,tree", "--verify chain,tree needs --tree-nodes N"},
      {"--tree-nodes 16,32", "--tree-nodes sizes a draft tree: it needs --verify tree"},
      {"--verify chain,tree --tree-nodes 16,x", "--tree-nodes 16,x: 'x' is not a number of nodes; give N or a comma list"},
      {"--verify tree --tree-nodes 16,,32", "--tree-nodes 16,,32: '' is not a number of nodes"},
      {"--verify tree --tree-nodes 16,16", "--tree-nodes 16,16: 16 is listed twice; give each budget once"},
      {"--verify tree --tree-nodes 16,0",
       "--tree-nodes 16,0: 0 is out of range; each budget takes a number of nodes from 1 to 16777216"},
      {"--verify tree --tree-nodes 8,16777217",
       "--tree-nodes 8,16777217: 16777217 is out of range; each budget takes a number of nodes from 1 to 16777216"},
      {"--tree-temperature 0.7", "--tree-temperature shapes a draft tree: it needs --verify tree"},
      {"--verify tree --tree-nodes 8 --tree-temperature 0", "--tree-temperature 0: '0' is not a temperature; each is a number above 0"},
      {"--verify tree --tree-nodes 8 --tree-temperature 1,-2", "--tree-temperature 1,-2: '-2' is not a temperature"},
      {"--verify tree --tree-nodes 8 --tree-temperature nan", "--tree-temperature nan: 'nan' is not a temperature"},
      {"--verify tree --tree-nodes 8 --tree-temperature inf", "--tree-temperature inf: 'inf' is not a temperature"},
      {"--verify tree --tree-nodes 8 --tree-temperature 0.7x", "--tree-temperature 0.7x: '0.7x' is not a temperature"},
      {"--verify tree --tree-nodes 8 --tree-temperature 0.7,0.7",
       "--tree-temperature 0.7,0.7: 0.7 is listed twice; give each temperature once"}};
  for (const auto& [flag, message] : numbers) {
    HostRun r = host(command + " --prompts " + prompts + " " + flag);
    EXPECT_EQ(r.status, 2) << flag;
    EXPECT_CONTAINS(r.err, message);
  }
  // Bounded: before these checks existed, a bad --report surfaced only after a whole evaluation.
  const std::string base = command + " --max-prompts 1 --max-new-tokens 4";
  dflash::test::TempDir temp("dflash_cli_eval");
  auto fails_before_loading = [&](const std::string& args, const std::string& message) {
    HostRun r = host(base + " " + args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
    EXPECT_CONTAINS(r.err, message);
    EXPECT_EQ(r.err.find("loading "), std::string::npos) << "nothing may be loaded first: " << r.err;
  };
  const std::string missing_folder = (temp.path() / "no-such-folder" / "report.json").string();
  fails_before_loading("--prompts " + prompts + " --report " + missing_folder,
                       "--report " + missing_folder + ": the folder " + (temp.path() / "no-such-folder").string() +
                           " does not exist; create it first");
  fails_before_loading("--prompts " + prompts + " --report " + temp.path().string(),
                       "--report " + temp.path().string() + " is a directory; give a file name");
  fails_before_loading("--prompts " + temp.path().string(),
                       temp.path().string() + " is a directory, not a prompts file; give a JSON-lines file of prompts");
  fails_before_loading("--prompts " + (temp.path() / "none.jsonl").string(),
                       (temp.path() / "none.jsonl").string() + ": no such prompts file");
}

TEST(Cli, TrainRunsAnyFivePluginsThroughTheAbi) {
  dflash::test::TempDir out("dflash_cli_train");
  const fs::path file = write_config("train.json", R"({
    "train": {"steps": 2, "progress": "lines"},
    "data": {"plugin": "test_data"}, "target": {"plugin": "test_target"},
    "drafter": {"plugin": "test_drafter"}, "loss": {"plugin": "test_loss"},
    "scheduler": {"plugin": "test_schedule"}})");
  HostRun r = host("--config " + file.string() + " --set train.output_dir=" + out.path().string() + kGood);  // train is the default command
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.err, "step 2/2");
  std::ifstream metrics(out.path() / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  EXPECT_EQ(lines, 2);
  EXPECT_TRUE(fs::exists(out.path() / "checkpoints" / "latest"));

  HostRun failing = host("train --config " + file.string() + " --loss throwing_loss" + kGood);
  EXPECT_EQ(failing.status, 1);
  EXPECT_CONTAINS(failing.err, "loss plugin 'throwing_loss'");
  EXPECT_CONTAINS(failing.err, "failed to create");

  HostRun incomplete = host("train --loss test_loss --config " + write_config("part.json", "{}").string() + kGood);
  EXPECT_EQ(incomplete.status, 2);
  EXPECT_CONTAINS(incomplete.err, "--data NAME");
}

// token-counts: each target token's supervised occurrences in one epoch of
// the config's data, read through the data plugin (what a draft vocabulary
// is built from), against counts made here from the same lines.
TEST(Cli, TokenCountsCountTheSupervisedTokensOfOneEpoch) {
  const fs::path data = write_config("counts.jsonl", "");
  std::vector<int64_t> expected(301, 0);
  {
    std::ofstream lines(data);
    for (int line = 0; line < 40; ++line) {
      nlohmann::json ids = nlohmann::json::array(), mask = nlohmann::json::array();
      const int length = 5 + line % 7;
      for (int t = 0; t < length; ++t) {
        const int64_t id = (line * 37 + t * 11) % 301;
        const int supervised = t >= 2 ? 1 : 0;
        ids.push_back(id);
        mask.push_back(supervised);
        expected[static_cast<size_t>(id)] += supervised;
      }
      lines << nlohmann::json{{"input_ids", ids}, {"loss_mask", mask}}.dump() << "\n";
    }
  }
  const std::string sections = R"("target": {"plugin": "hf_decoder", "path": ")" + std::string(DFLASH_HF_FIXTURES) +
                               R"(/qwen3"}, "drafter": {"plugin": "prompt_lookup"}, "loss": {"plugin": "test_loss"},
                               "scheduler": {"plugin": "constant"})";
  const fs::path config = write_config("counts.json", R"({"data": {"plugin": "jsonl", "path": ")" + data.string() +
                                                          R"(", "row_length": 16, "tokens_per_batch": 64}, )" + sections + "}");
  const fs::path out = write_config("counts_out.json", "");
  const std::string plugins = std::string(" --plugin-dir ") + DFLASH_INTREE_PLUGIN_DIR + kGood;
  HostRun r = host("token-counts --config " + config.string() + " --out " + out.string() + plugins);
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream written(out);
  const nlohmann::json counts = nlohmann::json::parse(written);
  EXPECT_EQ(counts.at("vocab_size"), 301);
  EXPECT_EQ(counts.at("counts").get<std::vector<int64_t>>(), expected) << "every supervised token once, none twice";
  int64_t total = 0;
  for (int64_t c : expected) total += c;
  EXPECT_EQ(counts.at("supervised_tokens"), total);
  EXPECT_CONTAINS(r.err, "token-counts: " + std::to_string(total) + " supervised tokens");

  // A data source that cannot end after one epoch is refused by name.
  const fs::path endless = write_config("counts_endless.json", R"({"data": {"plugin": "test_data"}, )" + sections + "}");
  HostRun refused = host("token-counts --config " + endless.string() + " --out " + out.string() + plugins);
  EXPECT_EQ(refused.status, 2) << refused.err;
  EXPECT_CONTAINS(refused.err, "data plugin 'test_data' has no 'epochs' setting");
  HostRun no_out = host("token-counts --config " + config.string() + plugins);
  EXPECT_EQ(no_out.status, 2);
  EXPECT_CONTAINS(no_out.err, "token-counts needs an output file: --out FILE.json");
}

TEST(Cli, ListPrintsEachSkippedLibraryOnce) {
  HostRun r = host("list" + kBroken);
  EXPECT_EQ(r.status, 0);
  EXPECT_CONTAINS(r.out, "no entry symbol");
  EXPECT_EQ(r.err.find("no entry symbol"), std::string::npos) << "not logged a second time: " << r.err;
  HostRun missing = host("list --plugin-dir /nonexistent/dir");
  EXPECT_EQ(missing.status, 2);
  EXPECT_CONTAINS(missing.err, "plugin directory '/nonexistent/dir' does not exist");
}

// Every shipped config stays valid against the in-tree plugins' schemas.
TEST(Cli, ShippedConfigsValidate) {
  size_t seen = 0;
  for (const auto& entry : fs::directory_iterator(DFLASH_CONFIGS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    HostRun r = host("config --config " + entry.path().string() + " --plugin-dir " + DFLASH_INTREE_PLUGIN_DIR);
    EXPECT_EQ(r.status, 0) << entry.path() << ": " << r.err;
    ++seen;
  }
  EXPECT_GE(seen, 1u);
}

TEST(Cli, BadUsage) {
  HostRun command = host("frobnicate");
  EXPECT_EQ(command.status, 2);
  EXPECT_CONTAINS(command.err, "unknown command 'frobnicate'");
  HostRun flag = host("list --no-such-flag");
  EXPECT_EQ(flag.status, 2);
  EXPECT_CONTAINS(flag.err, "no-such-flag");
  HostRun level = host("list --log-level loud");
  EXPECT_EQ(level.status, 2);
  EXPECT_CONTAINS(level.err, "--log-level loud");
}

}  // namespace
