#include "cli/cli_options.h"

#include "prepare/chat_format.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <charconv>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace dflash::cli {
namespace po = boost::program_options;
namespace {

const char* const kPluginFlags[] = {"data", "target", "drafter", "loss", "scheduler"};

po::options_description visible_options() {
  po::options_description options("Options");
  options.add_options()
      ("help,h", "print this help")
      ("version", "print the host's version, ABI and LibTorch build")
      ("plugin-dir", po::value<std::vector<std::string>>()->composing(),
       "a directory searched recursively for plugin libraries (*.so); repeatable")
      ("no-default-plugin-dirs", "do not search <prefix>/lib/dflash-host/plugins and $DFLASH_PLUGIN_PATH "
       "(colon-separated; relative entries are taken against the current directory)")
      ("allow-world-writable-plugins", "load plugin libraries that any user could have replaced (a world-writable "
       "file or folder) without warning")
      ("config", po::value<std::string>(), "the run's JSON config file")
      ("set", po::value<std::vector<std::string>>()->composing(),
       "override a config value: --set loss.temperature=2 (value parsed as JSON, else a string); repeatable")
      ("data", po::value<std::string>(), "data source plugin (sets data.plugin)")
      ("target", po::value<std::string>(), "target model plugin (sets target.plugin)")
      ("drafter", po::value<std::vector<std::string>>()->composing(),
       "drafter plugin (sets drafter.plugin); ab: repeat it, one arm each, as NAME or NAME:key=value,key=value "
       "(keys of the drafter section, or full paths)")
      ("loss", po::value<std::vector<std::string>>()->composing(),
       "loss plugin (sets loss.plugin); ab: repeat it, one arm each, as NAME or NAME:key=value,key=value "
       "(keys of the loss section, or full paths such as train.lr)")
      ("scheduler", po::value<std::string>(), "LR scheduler plugin (sets scheduler.plugin)")
      ("kind", po::value<std::string>(), "describe: the plugin kind when a name exists in several kinds")
      ("json", "list, plan: print JSON instead of a table")
      ("gpu-memory", po::value<std::string>(), "plan, train: the device's memory to plan against (e.g. 96GiB, 80GB) "
       "instead of what the driver reports free now")
      ("world-size", po::value<int64_t>(), "plan: the memory of one rank of a data-parallel run of this many ranks "
       "(its share of the global batch, of the optimizer under train.shard_optimizer, the gradient buckets)")
      ("target-ranks", po::value<int64_t>(), "train, plan: a disaggregated run with this many target ranks "
       "(sets train.mode = disaggregated and train.topology.target_ranks; docs/distributed.md)")
      ("drafter-ranks", po::value<int64_t>(), "train, plan: a disaggregated run with this many drafter ranks "
       "(sets train.mode = disaggregated and train.topology.drafter_ranks)")
      ("queue-depth", po::value<int64_t>(), "train, plan: hidden-state items a drafter rank holds at most (sets train.queue_depth)")
      ("calibrate", po::value<int64_t>(), "plan, with --target-ranks/--drafter-ranks: time this many batches of the "
       "target's forward and of the drafter's step on this device, and forecast every split of the world")
      ("tokens-per-batch", po::value<int64_t>(), "train, plan: the data source's token budget per batch (sets "
       "data.tokens_per_batch)")
      ("skip-memory-check", "train: start even when the memory plan says the run will not fit")
      ("rows", po::value<int64_t>(), "plan: plan the --loss alone, no target or drafter, at this many rows "
       "(with --vocab, and --hidden; dtype and teacher from the train section)")
      ("vocab", po::value<int64_t>(), "plan --rows: the vocabulary of the loss's logits")
      ("hidden", po::value<int64_t>(), "plan --rows: the hidden size of the rows (default 4096)")
      ("stop-after", po::value<int64_t>(), "train: stop after this many steps of this run, with a checkpoint "
       "(run again to resume from it)")
      ("resume-from", po::value<std::string>(), "train: resume from this checkpoint (step-NNNNNNNN, or a step number) "
       "of the run's checkpoints/ instead of `latest`; newer step folders are moved aside, not deleted")
      ("allow-config-change", "train: resume even though settings that shape the run (seed, data, model, loss, "
       "optimizer) differ from the checkpoint's; the run is then no longer reproducible")
      ("prompts", po::value<std::string>(), "eval, generate: prompts, JSON lines with \"prompt_ids\", \"input_ids\" "
       "(the first --prompt-tokens; generate: the tokens before the first loss_mask 1 when there is one) or \"text\" "
       "(byte-level targets)")
      ("drafter-checkpoint", po::value<std::string>(), "eval: the trained drafter: a checkpoint folder, a checkpoint "
       "root with `latest`, or a run's output_dir (default: the drafter as configured, e.g. prompt_lookup)")
      ("max-new-tokens", po::value<int64_t>(), "eval, generate: tokens generated per prompt at most (default 128)")
      ("max-length", po::value<int64_t>(), "eval, generate: prompt + generated tokens at most (default: the target's "
       "max_position_embeddings)")
      ("prompt-tokens", po::value<int64_t>(), "eval, generate: how many tokens of an \"input_ids\" line form the prompt (default 64)")
      ("max-prompts", po::value<int64_t>(), "eval, generate: use only the first N prompts")
      ("report", po::value<std::string>(), "eval: write the full report (per prompt too) to this JSON file; "
       "generate: its figures (tokens/s, settings)")
      ("no-baseline", "eval: skip decoding with the target alone (no lossless check, no speed-up)")
      ("verify", po::value<std::string>(), "eval: how a step verifies its drafts: chain (the drafter's block, default), "
       "tree (DDTree: the best --tree-nodes paths through the drafter's top candidates, one target pass), or chain,tree: "
       "both in one run, one report each and a comparison, the target alone decoding each prompt once")
      ("tree-nodes", po::value<std::string>(), "eval with --verify tree: drafted nodes per step (the newest token not "
       "counted); a comma list N1,N2,... runs one tree arm per budget")
      ("tree-temperature", po::value<std::string>(), "eval with --verify tree: sharpen (< 1) or flatten (> 1) the "
       "drafter's distributions before the tree is chosen (default 1: DDTree's own rule; still lossless); a comma "
       "list T1,T2,... runs every budget at each")
      ("draft-tokens", po::value<int64_t>(), "eval with chain verification: tokens the drafter proposes a step (default: "
       "its block_size - 1, e.g. an EAGLE-3 drafter's trained depth); with chain,tree the chain's")
      ("no-warmup", "eval: time the first prompt cold (by default it is decoded once, untimed, before the clocks run)")
      ("batch-size", po::value<int64_t>(), "generate: sequences decoded together, one target pass per step (default 1)")
      ("temperature", po::value<double>(), "generate: sample at this temperature (default 0: greedy)")
      ("top-p", po::value<double>(), "generate, sampling: only from the most likely tokens whose probability reaches "
       "this (default 1: all)")
      ("seed", po::value<int64_t>(), "generate, sampling: the seed (default: the config's train.seed); each prompt "
       "draws from its own stream, so the output does not depend on --batch-size")
      ("input", po::value<std::string>(), "prepare: conversations ({\"messages\": [...]}, ShareGPT "
       "{\"conversations\": [...]}) or texts ({\"text\": ...}), JSON lines")
      ("tokenizer", po::value<std::string>(), "prepare: a tokenizer.json, or a model folder holding one (default: the "
       "--config target's)")
      ("chat-format", po::value<std::string>(),
       ("prepare: one of " + prepare::chat_format_names() + " (default: what the model folder's chat template is)").c_str())
      ("for-generate", "prepare: write prompts for generate ({\"prompt_ids\"}: the conversation before its last "
       "assistant turn, then an open assistant turn) instead of training lines")
      ("system", po::value<std::string>(), "prepare: a system message for conversations that have none")
      ("seeds", po::value<int64_t>(), "ab: seeds per arm (0, 1, …; default 1)")
      ("steps", po::value<int64_t>(), "ab: training steps per arm (default: the config's train.steps)")
      ("out", po::value<std::string>(), "ab: the report folder (default: <train.output_dir>/ab); generate: the JSON-lines "
       "file of training lines to write; token-counts: the JSON file of counts to write")
      ("log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warn, error or off");
  return options;
}

// A number flag as the user wrote it, for messages (nan, 1e999, ...).
std::string vm_text(const po::variables_map& vm, const char* flag) {
  std::ostringstream out;
  out << vm[flag].as<double>();
  return out.str();
}

// A comma list's items as written ("16,,32" has an empty one).
std::vector<std::string> comma_items(const std::string& text) {
  std::vector<std::string> items;
  std::string::size_type begin = 0;
  for (;;) {
    const std::string::size_type comma = text.find(',', begin);
    items.push_back(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) return items;
    begin = comma + 1;
  }
}

// --verify's kinds, in order: chain, tree, or both, each once.
std::vector<std::string> verify_kinds(const std::string& text) {
  const std::vector<std::string> kinds = comma_items(text);
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] != "chain" && kinds[i] != "tree")
      throw std::invalid_argument("--verify " + text + ": takes chain, tree or chain,tree");
    for (size_t j = 0; j < i; ++j)
      if (kinds[j] == kinds[i])
        throw std::invalid_argument("--verify " + text + ": " + kinds[i] + " is listed twice; takes chain, tree or chain,tree "
                                    "(a tree arm per budget comes from --tree-nodes N1,N2,...)");
  }
  return kinds;
}

// --tree-nodes N or N1,N2,...: one budget per draft-tree arm, each from 1 to
// kMaxEvalCount, each once (a sweep evaluates each budget once).
std::vector<int64_t> tree_budgets(const std::string& text) {
  const std::vector<std::string> items = comma_items(text);
  const std::string range = "a number of nodes from 1 to " + std::to_string(kMaxEvalCount);
  std::vector<int64_t> budgets;
  for (const std::string& item : items) {
    int64_t budget = 0;
    const char* end = item.data() + item.size();
    const auto [stop, error] = std::from_chars(item.data(), end, budget);
    const bool out_of_range = error == std::errc::result_out_of_range;
    if ((error != std::errc() && !out_of_range) || stop != end)
      throw std::invalid_argument("--tree-nodes " + text + ": '" + item + "' is not a number of nodes; give N or a comma "
                                  "list N1,N2,... (e.g. 16,32,64,128)");
    if (out_of_range || budget < 1 || budget > kMaxEvalCount)
      throw std::invalid_argument("--tree-nodes " + text + ": " +
                                  (items.size() == 1 ? "takes " + range : item + " is out of range; each budget takes " + range));
    if (std::find(budgets.begin(), budgets.end(), budget) != budgets.end())
      throw std::invalid_argument("--tree-nodes " + text + ": " + std::to_string(budget) + " is listed twice; give each budget once");
    budgets.push_back(budget);
  }
  return budgets;
}

// --tree-temperature T or T1,T2,...: each a finite number above 0, each once.
std::vector<double> tree_temperatures(const std::string& text) {
  std::vector<double> temperatures;
  for (const std::string& item : comma_items(text)) {
    double t = 0;
    const char* end = item.data() + item.size();
    const auto [stop, error] = std::from_chars(item.data(), end, t);
    if (error != std::errc() || stop != end || !eval::valid_tree_temperature(t))
      throw std::invalid_argument("--tree-temperature " + text + ": '" + item + "' is not a temperature; each is a number "
                                  "above 0 (1: DDTree's own rule, 0.7: sharper), e.g. 1,0.7");
    if (std::find(temperatures.begin(), temperatures.end(), t) != temperatures.end())
      throw std::invalid_argument("--tree-temperature " + text + ": " + item + " is listed twice; give each temperature once");
    temperatures.push_back(t);
  }
  return temperatures;
}

// eval's arms, built once here: the chain where --verify lists it, a tree
// per --tree-temperature and --tree-nodes budget (temperatures outer) where
// it lists tree, in --verify's order.
std::vector<eval::Verification> eval_arms(const po::variables_map& vm) {
  const std::string verify = vm.count("verify") ? vm["verify"].as<std::string>() : "chain";
  const std::vector<std::string> kinds = verify_kinds(verify);
  const std::vector<int64_t> budgets = vm.count("tree-nodes") ? tree_budgets(vm["tree-nodes"].as<std::string>())
                                                              : std::vector<int64_t>{};
  const std::vector<double> temperatures = vm.count("tree-temperature")
                                                ? tree_temperatures(vm["tree-temperature"].as<std::string>())
                                                : std::vector<double>{1.0};
  const bool chain = std::find(kinds.begin(), kinds.end(), "chain") != kinds.end();
  const bool tree = std::find(kinds.begin(), kinds.end(), "tree") != kinds.end();
  if (!chain && vm.count("draft-tokens"))
    throw std::invalid_argument("--draft-tokens sets a chain's length; a draft tree's size is --tree-nodes");
  if (tree && budgets.empty())
    throw std::invalid_argument("--verify " + verify + " needs --tree-nodes N, the drafted nodes a step verifies (DDTree "
                                "sweeps 16 to 128; a comma list N1,N2,... evaluates each)");
  if (!tree && !budgets.empty())
    throw std::invalid_argument("--tree-nodes sizes a draft tree: it needs --verify tree (or chain,tree beside the chain)");
  if (!tree && vm.count("tree-temperature"))
    throw std::invalid_argument("--tree-temperature shapes a draft tree: it needs --verify tree (or chain,tree beside the chain)");
  std::vector<eval::Verification> arms;
  for (const std::string& kind : kinds) {
    if (kind == "chain") arms.push_back(eval::Verification{});
    else
      for (double temperature : temperatures)
        for (int64_t budget : budgets)
          arms.push_back(eval::Verification{eval::Verification::Kind::kTree, budget, temperature});
  }
  return arms;
}

}  // namespace

std::string usage_text() {
  std::ostringstream out;
  out << "Usage: dflash-host [COMMAND] [ARGS] [OPTIONS]\n\n"
         "Commands:\n"
         "  train              train a drafter (the default command)\n"
         "  list               list the plugins found, and the libraries skipped and why\n"
         "  describe NAME      a plugin's kind, version, ABI, file and config with defaults;\n"
         "                     `describe host` prints the host's own \"train\" section\n"
         "  config             validate the config against every chosen plugin and print it\n"
         "                     with all defaults filled in\n"
         "  plan               predict the run's device memory by category before anything is\n"
         "                     allocated, compare it with the device, and when it does not fit\n"
         "                     propose the largest token budget / anchor count / chunk size\n"
         "                     that does (train runs the same check first)\n"
         "  eval               speculative decoding of --prompts with the config's target and\n"
         "                     drafter (--drafter-checkpoint): acceptance length, speed-up, and\n"
         "                     a token-for-token check against the target's greedy decoding\n"
         "  generate           the target answers every --prompts line (batched, greedy or\n"
         "                     sampled) and --out gets training lines: prompt masked, answer\n"
         "                     supervised, as the jsonl data source reads them\n"
         "  prepare            conversations or texts (--input, JSON lines) → training lines\n"
         "                     (--out) in the model's chat format, assistant turns supervised;\n"
         "                     --for-generate writes prompts for generate instead\n"
         "  ab                 train one arm per --loss, or per --drafter (same data, seed and\n"
         "                     target), check step-0 gradients between arms, and write a report\n"
         "                     folder\n"
         "  token-counts       how often each target token is supervised in one epoch of the\n"
         "                     config's data (--out, JSON): what a draft vocabulary is built from\n\n"
      << visible_options() << "\n"
      << "Exit status: 0 success, 1 a failure while running, 2 bad usage or configuration,\n"
         "3 a feature this build does not have yet, 4 training stopped on non-finite losses,\n"
         "5 out of device memory (an emergency checkpoint and a report were written),\n"
         "6 the memory plan says the run does not fit (train without --skip-memory-check),\n"
         "7 training stopped on SIGTERM or SIGINT (a checkpoint of every step done was written;\n"
         "  the same command resumes), 8 ab: an arm or seed failed (the report is written).\n\n"
      << "Example:\n  dflash-host --plugin-dir build/lib/dflash-host/plugins --loss fused_ckpt_kl --config configs/quickstart.json\n";
  return out.str();
}

CliOptions parse_command_line(int argc, const char* const argv[]) {
  po::options_description hidden("hidden");
  hidden.add_options()("positional", po::value<std::vector<std::string>>(), "");
  po::options_description all;
  all.add(visible_options()).add(hidden);
  po::positional_options_description positional;
  positional.add("positional", -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw std::invalid_argument(std::string(e.what()) + " (see dflash-host --help)");
  }

  CliOptions options;
  options.help = vm.count("help") > 0;
  options.version = vm.count("version") > 0;
  options.json = vm.count("json") > 0;
  if (vm.count("gpu-memory")) options.device_memory = vm["gpu-memory"].as<std::string>();
  if (vm.count("world-size")) {
    options.world_size = vm["world-size"].as<int64_t>();
    if (options.world_size < 1) throw std::invalid_argument("--world-size " + std::to_string(options.world_size) + ": expected 1 or more");
  }
  options.skip_memory_check = vm.count("skip-memory-check") > 0;
  options.default_plugin_dirs = vm.count("no-default-plugin-dirs") == 0;
  options.allow_world_writable_plugins = vm.count("allow-world-writable-plugins") > 0;
  if (vm.count("plugin-dir")) options.plugin_dirs = vm["plugin-dir"].as<std::vector<std::string>>();
  if (vm.count("config")) options.config_file = vm["config"].as<std::string>();
  if (vm.count("set")) options.overrides = vm["set"].as<std::vector<std::string>>();
  // The topology flags are --set lines of their own, after the user's.
  auto count_flag = [&](const char* flag, const char* key, int64_t least) {
    if (!vm.count(flag)) return false;
    const int64_t value = vm[flag].as<int64_t>();
    if (value < least)
      throw std::invalid_argument(std::string("--") + flag + " " + std::to_string(value) + ": expected " +
                                  std::to_string(least) + " or more");
    options.overrides.push_back(std::string(key) + "=" + std::to_string(value));
    return true;
  };
  const bool targets = count_flag("target-ranks", "train.topology.target_ranks", 1);
  const bool drafters = count_flag("drafter-ranks", "train.topology.drafter_ranks", 1);
  if (targets || drafters) options.overrides.push_back("train.mode=disaggregated");
  count_flag("queue-depth", "train.queue_depth", 1);
  if (vm.count("calibrate")) {
    options.calibrate = vm["calibrate"].as<int64_t>();
    if (options.calibrate < 1 || options.calibrate > 1000)
      throw std::invalid_argument("--calibrate " + std::to_string(options.calibrate) + ": expected a number of batches from 1 to 1000");
  }
  count_flag("tokens-per-batch", "data.tokens_per_batch", 1);
  if (vm.count("rows")) options.loss_alone_rows = vm["rows"].as<int64_t>();
  if (vm.count("vocab")) options.loss_alone_vocab = vm["vocab"].as<int64_t>();
  if (vm.count("hidden")) options.loss_alone_hidden = vm["hidden"].as<int64_t>();
  if ((options.loss_alone_vocab || options.loss_alone_hidden) && !options.loss_alone_rows)
    throw std::invalid_argument("--vocab and --hidden size a loss planned alone: give --rows too (plan --loss NAME "
                                "--rows N --vocab V)");
  if (vm.count("kind")) options.kind = vm["kind"].as<std::string>();
  if (vm.count("stop-after")) {
    options.stop_after = vm["stop-after"].as<int64_t>();
    if (options.stop_after < 1) throw std::invalid_argument("--stop-after takes a number of steps >= 1");
  }
  if (vm.count("resume-from")) options.resume_from = vm["resume-from"].as<std::string>();
  options.allow_config_change = vm.count("allow-config-change") > 0;
  if (vm.count("prompts")) options.prompts = vm["prompts"].as<std::string>();
  if (vm.count("drafter-checkpoint")) options.drafter_checkpoint = vm["drafter-checkpoint"].as<std::string>();
  if (vm.count("report")) options.report = vm["report"].as<std::string>();
  options.baseline = vm.count("no-baseline") == 0;
  options.warmup = vm.count("no-warmup") == 0;
  auto positive = [&](const char* flag, int64_t& into, int64_t minimum) {
    if (!vm.count(flag)) return;
    into = vm[flag].as<int64_t>();
    if (into < minimum)
      throw std::invalid_argument(std::string("--") + flag + " takes a number >= " + std::to_string(minimum));
  };
  auto in_range = [&](const char* flag, int64_t& into, int64_t minimum, const char* unit) {
    if (!vm.count(flag)) return;
    into = vm[flag].as<int64_t>();
    if (into < minimum || into > kMaxEvalCount)
      throw std::invalid_argument(std::string("--") + flag + " " + std::to_string(into) + ": takes " + unit + " from " +
                                  std::to_string(minimum) + " to " + std::to_string(kMaxEvalCount));
  };
  in_range("max-new-tokens", options.max_new_tokens, 1, "a number of tokens");
  in_range("max-length", options.max_length, 2, "a number of tokens");
  in_range("prompt-tokens", options.prompt_tokens, 1, "a number of tokens");
  in_range("max-prompts", options.max_prompts, 1, "a number of prompts");
  in_range("draft-tokens", options.draft_tokens, 1, "a number of tokens");
  options.verifications = eval_arms(vm);
  if (vm.count("batch-size")) options.batch_size = vm["batch-size"].as<int64_t>();
  if (options.batch_size < 1 || options.batch_size > kMaxBatchSize)
    throw std::invalid_argument("--batch-size " + std::to_string(options.batch_size) + ": takes a number of sequences from 1 to " +
                                std::to_string(kMaxBatchSize));
  if (vm.count("temperature")) {
    options.temperature = vm["temperature"].as<double>();
    if (!(*options.temperature >= 0 && *options.temperature <= kMaxTemperature))  // NaN fails too
      throw std::invalid_argument("--temperature " + vm_text(vm, "temperature") + ": takes a number from 0 (greedy) to " +
                                  std::to_string(static_cast<int>(kMaxTemperature)));
  }
  if (vm.count("top-p")) {
    options.top_p = vm["top-p"].as<double>();
    if (!(*options.top_p > 0 && *options.top_p <= 1))
      throw std::invalid_argument("--top-p " + vm_text(vm, "top-p") + ": takes a probability above 0 and at most 1");
  }
  if (vm.count("seed")) {
    options.seed = vm["seed"].as<int64_t>();
    if (*options.seed < 0)
      throw std::invalid_argument("--seed " + std::to_string(*options.seed) + ": takes a number from 0 to 9223372036854775807");
  }
  if (vm.count("input")) options.input = vm["input"].as<std::string>();
  if (vm.count("tokenizer")) options.tokenizer = vm["tokenizer"].as<std::string>();
  if (vm.count("chat-format")) options.chat_format = vm["chat-format"].as<std::string>();
  options.for_generate = vm.count("for-generate") > 0;
  if (vm.count("system")) options.system = vm["system"].as<std::string>();
  positive("seeds", options.seeds, 1);
  positive("steps", options.steps, 1);
  options.log_level = vm["log-level"].as<std::string>();
  for (const char* flag : kPluginFlags) {
    if (!vm.count(flag)) continue;
    if (std::string(flag) == "loss" || std::string(flag) == "drafter") {
      std::vector<std::string>& arms = std::string(flag) == "loss" ? options.loss_arms : options.drafter_arms;
      arms = vm[flag].as<std::vector<std::string>>();
      options.plugin_choice[flag] = arms.front().substr(0, arms.front().find(':'));
    } else {
      options.plugin_choice[flag] = vm[flag].as<std::string>();
    }
  }
  if (vm.count("out")) options.out_dir = vm["out"].as<std::string>();


  std::vector<std::string> positionals;
  if (vm.count("positional")) positionals = vm["positional"].as<std::vector<std::string>>();
  options.command = positionals.empty() ? "train" : positionals.front();
  if (!positionals.empty()) options.arguments.assign(positionals.begin() + 1, positionals.end());
  static const char* const kCommands[] = {"train", "list", "describe", "config", "plan", "eval", "generate", "prepare", "ab",
                                         "token-counts"};
  bool known = false;
  for (const char* command : kCommands) known = known || options.command == command;
  if (!known)
    throw std::invalid_argument("unknown command '" + options.command +
                                "'; commands are train, list, describe, config, plan, eval, generate, prepare, ab, token-counts (see dflash-host --help)");
  for (const auto& [flag, arms] : {std::pair<std::string, const std::vector<std::string>&>{"loss", options.loss_arms},
                                   std::pair<std::string, const std::vector<std::string>&>{"drafter", options.drafter_arms}}) {
    if (arms.size() > 1 && options.command != "ab")
      throw std::invalid_argument("--" + flag + " is given " + std::to_string(arms.size()) + " times; only `ab` compares several " +
                                  flag + "s (one arm each)");
    if (options.command != "ab" && !arms.empty() && arms.front().find(':') != std::string::npos)
      throw std::invalid_argument("--" + flag + " NAME:settings is for `ab` arms; with " + options.command + " use --" + flag +
                                  " NAME and --set " + flag + ".key=value");
  }
  if (options.loss_arms.size() > 1 && options.drafter_arms.size() > 1)
    throw std::invalid_argument("ab compares arms along one section: give --loss several times or --drafter several times, "
                                "not both");
  return options;
}

}  // namespace dflash::cli
