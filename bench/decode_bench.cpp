// Where decoding time goes at batch 1 on one GPU: target-only greedy decoding
// (eval's baseline) and speculative decoding with a DFlash drafter, per token
// and per phase, through the plugin ABI exactly as `dflash-host eval` decodes
// (eval::greedy_decode / eval::speculative_decode). A program, not a test:
// docs/performance.md ("Decoding") has the method and the figures.
//
//   decode_bench --plugin-dir build-gpu/lib/dflash-host/plugins --model TARGET_DIR [--target hf_decoder|hf_hybrid]
//                [--drafter-checkpoint DIR | --random-drafter LAYERS [--block-size 16]]
//                [--prompts FILE.jsonl --prompt-tokens 64 | --random-prompts]  [--max-prompts 8]
//                [--max-new-tokens 128] [--dtype bfloat16] [--arms graphs,exact,eager,aten] [--json out.json]
//                [--trace PREFIX] [--verify chain|tree --tree-nodes N [--tree-temperature T]]
//                [--drafter NAME [--drafter-set key=value ...]]
//
// --drafter NAME: another drafter plugin than dflash (e.g. eagle3), configured
// from its schema's defaults and --drafter-set; its checkpoint is loaded as
// eval loads one. The arms' graph settings apply to the dflash drafter only.
//
// --verify tree: speculative decoding verifies DDTree draft trees of N
// drafted nodes per step (docs/eval.md, "Draft trees") instead of chains.
//
// --target hf_hybrid: a Qwen3.5 / Qwen3.6 hybrid folder. That plugin has no
// kernel or graph settings: an arm sets its exact_decoding (on for `exact`,
// off otherwise) and the drafter's settings; its default arms are exact and
// eager (the hybrid target's steps always run eagerly).
//
// Arms (each its own target and drafter instances):
//   graphs  GPU kernels, flash decoding, CUDA graphs (decode_graphs: auto), exact_decoding off
//   exact   the defaults: graphs with the target's exact_decoding on (row-invariant kernels for steps of <= 16 tokens)
//   eager   the same kernels, every step launched eagerly (decode_graphs: off)
//   aten    the ATen reference path (kernels: aten; no graphs)
// Each arm decodes every prompt twice per decoding: once plain (the per-token
// figures) and once with a device wait after every phase (the breakdown;
// those waits cost a little, so its total is reported beside the plain one).
// The first prompt is decoded once more before anything is timed (warm-up:
// lazy initialisation, and graph capture on a shape's second use).
//
// --trace PREFIX: after each arm's timings, the first prompt decoded once
// more under the profiler, greedy then speculative, written as Chrome traces
// PREFIX-ARM-greedy.json and PREFIX-ARM-speculative.json (kineto_trace.h;
// scripts/trace_gaps.py says where the device waited).
//
// Prints one JSON object (also written to --json).
#include "bench_args.h"
#include "kineto_trace.h"
#include "checkpoint/checkpoint.h"
#include "config/config_schema.h"
#include "eval/divergence.h"
#include "eval/evaluation.h"
#include "eval/prompts.h"
#include "eval/speculative.h"
#include "export_format.h"
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "train/frozen_weights.h"

#include <dflash/sdk/torch.hpp>

#include <c10/core/GradMode.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {
using namespace dflash;

struct Args {
  std::string plugin_dir, model, drafter_checkpoint, prompts, json, trace, dtype = "bfloat16", device = "cuda:0";
  std::string target = "hf_decoder";
  std::string drafter = "dflash";
  nlohmann::json drafter_settings = nlohmann::json::object();  // --drafter-set key=value, for a drafter other than dflash
  std::vector<std::string> arms;  // none given: the target's default arms
  int64_t random_drafter_layers = 0, block_size = 16, prompt_tokens = 64, max_prompts = 8, max_new_tokens = 128;
  bool random_prompts = false;
  eval::Verification verification;  // --verify tree --tree-nodes N
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  dflash::bench::FlagReader r(argc, argv);
  while (r.next()) {
    if (r.is("--plugin-dir")) a.plugin_dir = r.text();
    else if (r.is("--model")) a.model = r.text();
    else if (r.is("--drafter-checkpoint")) a.drafter_checkpoint = r.text();
    else if (r.is("--random-drafter")) a.random_drafter_layers = r.integer();
    else if (r.is("--block-size")) a.block_size = r.integer();
    else if (r.is("--prompts")) a.prompts = r.text();
    else if (r.is("--random-prompts")) a.random_prompts = true;
    else if (r.is("--prompt-tokens")) a.prompt_tokens = r.integer();
    else if (r.is("--max-prompts")) a.max_prompts = r.integer();
    else if (r.is("--max-new-tokens")) a.max_new_tokens = r.integer();
    else if (r.is("--dtype")) a.dtype = r.text();
    else if (r.is("--device")) a.device = r.text();
    else if (r.is("--arms")) a.arms = split(r.text(), ',');
    else if (r.is("--target")) a.target = r.text();
    else if (r.is("--drafter")) a.drafter = r.text();
    else if (r.is("--drafter-set")) r.setting(a.drafter_settings);
    else if (r.is("--json")) a.json = r.text();
    else if (r.is("--trace")) a.trace = r.text();
    else if (r.is("--verify")) {
      const std::string how = r.text();
      if (how != "chain" && how != "tree") throw std::invalid_argument("--verify " + how + ": takes chain or tree");
      a.verification.kind = how == "tree" ? eval::Verification::Kind::kTree : eval::Verification::Kind::kChain;
    } else if (r.is("--tree-nodes")) a.verification.tree_nodes = r.integer();
    else if (r.is("--tree-temperature")) a.verification.tree_temperature = r.number();
    else r.unknown();
  }
  if (a.plugin_dir.empty() || a.model.empty()) throw std::invalid_argument("--plugin-dir DIR and --model DIR are required");
  if ((a.verification.kind == eval::Verification::Kind::kTree) != (a.verification.tree_nodes > 0))
    throw std::invalid_argument("--verify tree and --tree-nodes N (N >= 1) go together");
  if (a.prompts.empty() == !a.random_prompts) throw std::invalid_argument("give --prompts FILE or --random-prompts");
  if (!a.drafter_checkpoint.empty() && a.random_drafter_layers > 0)
    throw std::invalid_argument("--drafter-checkpoint and --random-drafter exclude each other");
  if (a.target != "hf_decoder" && a.target != "hf_hybrid")
    throw std::invalid_argument("--target " + a.target + ": takes hf_decoder or hf_hybrid");
  if (a.arms.empty())
    a.arms = a.target == "hf_hybrid" ? std::vector<std::string>{"exact", "eager"} : std::vector<std::string>{"graphs", "eager", "aten"};
  for (const auto& arm : a.arms)
    if (arm != "graphs" && arm != "exact" && arm != "eager" && arm != "aten")
      throw std::invalid_argument("unknown arm " + arm + " (graphs, exact, eager, aten)");
  return a;
}

// The dflash plugin's config for a drafter: the checkpoint's shape, or a
// random one of `layers` layers with the target's widths.
// Whether an arm replays CUDA graphs (its target and drafter alike).
bool arm_uses_graphs(const std::string& arm) { return arm == "graphs" || arm == "exact"; }

nlohmann::json drafter_config(const Args& a, const nlohmann::json& exported, const std::string& arm) {
  nlohmann::json c = {{"num_layers", a.random_drafter_layers}, {"num_attention_heads", 0}, {"num_key_value_heads", 0},
                      {"head_dim", 0}, {"intermediate_size", 0}, {"block_size", a.block_size}, {"max_anchors", 512},
                      {"gamma", 0.0}, {"mask_token_id", -1}, {"target_layer_ids", nlohmann::json::array()},
                      {"init_std", 0.02}, {"rope_theta", 0.0}, {"attention", "grouped"}, {"attention_group_blocks", 64},
                      {"attention_group_key_multiple", 128}, {"attention_kernel", "auto"}, {"embedding_on_cpu", false}, {"activation_checkpointing", false},
                      {"decode_graphs", arm_uses_graphs(arm) ? "auto" : "off"}, {"kernels", arm == "aten" ? "aten" : "auto"}};
  if (!exported.is_null()) {
    const drafter::ExportedDrafter e = drafter::read_export_config(exported);
    c["num_layers"] = e.shape.layers;
    c["num_attention_heads"] = e.shape.heads;
    c["num_key_value_heads"] = e.shape.kv_heads;
    c["head_dim"] = e.shape.head_dim;
    c["intermediate_size"] = e.shape.intermediate;
    c["block_size"] = e.block_size;
    c["mask_token_id"] = e.mask_token;
    c["target_layer_ids"] = e.layer_ids;
    c["rope_theta"] = e.shape.rope_theta;
  }
  return c;
}

struct Totals {
  int64_t tokens = 0, steps = 0, identical = 0, step_tokens = 0;
  int64_t near_ties = 0, other_divergences = 0;  // the other prompts, as eval classifies them (eval/divergence.h)
  double seconds = 0;
};

nlohmann::json phases_json(const eval::DecodeProfile& p, double per) {
  auto ms = [&](double s) { return per > 0 ? 1e3 * s / per : 0.0; };
  return {{"target", ms(p.target)}, {"propose", ms(p.propose)}, {"extend", ms(p.extend)}, {"accept", ms(p.accept)},
          {"other", ms(p.other)}, {"total", ms(p.target + p.propose + p.extend + p.accept + p.other)}};
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "decode_bench: " << e.what() << "\n";
    return 2;
  }
  const c10::Device device(args.device);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::cerr << "decode_bench: no CUDA device\n";
    return 3;
  }
  const c10::NoGradGuard no_grad;
  host::PluginRegistry registry;
  registry.add_directory(args.plugin_dir);
  const auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };

  // The drafter's checkpoint, read once.
  nlohmann::json exported;
  const bool speculative = !args.drafter_checkpoint.empty() || args.random_drafter_layers > 0;
  if (!args.drafter_checkpoint.empty()) {
    const checkpoint::DrafterDirectory saved = checkpoint::load_drafter(args.drafter_checkpoint);
    exported = saved.config;
  }

  nlohmann::json report = {{"model", args.model},
                           {"target", args.target},
                           {"drafter", args.drafter_checkpoint.empty()
                                           ? (args.random_drafter_layers > 0 ? "random, " + std::to_string(args.random_drafter_layers) + " layers"
                                                                             : std::string("none"))
                                           : args.drafter_checkpoint},
                           {"device", args.device},
                           {"dtype", args.dtype},
                           {"max_new_tokens", args.max_new_tokens},
                           {"arms", nlohmann::json::array()}};
  std::vector<eval::Prompt> prompts;
  for (const std::string& arm : args.arms) {
    nlohmann::json target_config = {{"path", args.model}, {"dtype", "auto"}, {"feature_layers", 5}};
    if (args.target == "hf_decoder") {
      target_config["kernels"] = arm == "aten" ? "aten" : "auto";
      target_config["attention"] = "auto";
      target_config["decode_graphs"] = arm_uses_graphs(arm) ? "auto" : "off";
    }
    target_config["exact_decoding"] = arm == "exact" ? "on" : "off";  // graphs: the usual kernels, to compare
    host::TargetModelInstance target(registry.find(DFLASH_KIND_TARGET_MODEL, args.target), target_config,
                                     {args.device, args.dtype, 0});
    const nlohmann::json info = target.describe();
    if (prompts.empty()) {
      if (args.random_prompts) {
        std::mt19937_64 random(7);
        const int64_t vocab = info.at("vocab_size").get<int64_t>();
        for (int64_t i = 0; i < args.max_prompts; ++i) {
          eval::Prompt p;
          p.line = i + 1;
          for (int64_t t = 0; t < args.prompt_tokens; ++t) p.ids.push_back(static_cast<int64_t>(random() % static_cast<uint64_t>(vocab)));
          prompts.push_back(p);
        }
      } else {
        eval::PromptSettings s;
        s.file = args.prompts;
        s.prompt_tokens = args.prompt_tokens;
        s.max_prompts = args.max_prompts;
        prompts = eval::read_prompts(s, info);
      }
    }
    eval::DecodeLimits limits;
    limits.max_new_tokens = args.max_new_tokens;
    limits.max_length = info.value("max_position_embeddings", int64_t{0});
    limits.eos_token_ids = info.value("eos_token_ids", std::vector<int64_t>{});

    std::unique_ptr<host::DrafterInstance> drafter;
    std::vector<int64_t> layer_ids;
    int64_t block_size = args.block_size;
    if (speculative) {
      const auto& record = registry.find(DFLASH_KIND_DRAFTER, args.drafter);
      const nlohmann::json config =
          args.drafter == "dflash" ? drafter_config(args, exported, arm)
                                   : config::validate_and_fill(record.schema, args.drafter_settings, "drafter", record.label());
      drafter = std::make_unique<host::DrafterInstance>(record, config, host::InstanceOptions{args.device, args.dtype, 1});
      drafter->bind_target(info, host::place_frozen_weights(target.frozen_weights(), args.target, device,
                                                             sdk::parse_dtype(args.dtype)));
      drafter->set_training(false);
      if (!args.drafter_checkpoint.empty()) eval::load_drafter_checkpoint(args.drafter_checkpoint, *drafter, info);
      const nlohmann::json own = *drafter->export_config();
      layer_ids = own.at("target_layer_ids").get<std::vector<int64_t>>();
      block_size = own.at("block_size").get<int64_t>();
    }

    // Warm-up: the first prompt through both decodings, twice (graphs are captured on a shape's second use).
    for (int i = 0; i < 2; ++i) {
      eval::greedy_decode(target, prompts[0].ids, limits);
      if (drafter) eval::speculative_decode(target, *drafter, prompts[0].ids, limits, block_size, layer_ids, nullptr, args.verification);
    }
    sync();

    nlohmann::json result = {{"arm", arm}};
    // Target-only greedy decoding, plain then profiled.
    Totals greedy;
    std::vector<std::vector<int64_t>> greedy_tokens;
    for (const auto& p : prompts) {
      const eval::Generation g = eval::greedy_decode(target, p.ids, limits);
      greedy.tokens += static_cast<int64_t>(g.tokens.size());
      greedy.seconds += g.seconds;
      greedy_tokens.push_back(g.tokens);
    }
    eval::DecodeProfile greedy_profile;
    greedy_profile.sync = sync;
    for (const auto& p : prompts) eval::greedy_decode(target, p.ids, limits, &greedy_profile);
    // The target's graph counts so far: with the counts at the end, they say
    // whether the verification passes replayed as the single tokens did.
    const nlohmann::json graphs_after_greedy = target.describe().value("decode_graph_stats", nlohmann::json::object());
    result["greedy"] = {{"tokens", greedy.tokens},
                        {"seconds", greedy.seconds},
                        {"ms_per_token", 1e3 * greedy.seconds / static_cast<double>(std::max<int64_t>(1, greedy.tokens))},
                        {"tokens_per_s", greedy.seconds > 0 ? static_cast<double>(greedy.tokens) / greedy.seconds : 0.0},
                        {"profiled_ms_per_token", phases_json(greedy_profile, static_cast<double>(greedy_profile.tokens))}};

    if (drafter) {
      Totals spec;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const eval::Generation g =
            eval::speculative_decode(target, *drafter, prompts[i].ids, limits, block_size, layer_ids, nullptr, args.verification);
        spec.tokens += static_cast<int64_t>(g.tokens.size());
        spec.seconds += g.seconds;
        spec.steps += static_cast<int64_t>(g.step_tokens.size());
        for (int64_t t : g.step_tokens) spec.step_tokens += t;
        spec.identical += g.tokens == greedy_tokens[i];
        // Outside the clocks: one extra target pass where the outputs part.
        if (const auto d = eval::find_divergence(target, prompts[i].ids, g.tokens, greedy_tokens[i]))
          ++(d->near_tie ? spec.near_ties : spec.other_divergences);
      }
      eval::DecodeProfile profile;
      profile.sync = sync;
      for (const auto& p : prompts)
        eval::speculative_decode(target, *drafter, p.ids, limits, block_size, layer_ids, &profile, args.verification);
      const double greedy_rate = greedy.seconds > 0 ? static_cast<double>(greedy.tokens) / greedy.seconds : 0.0;
      const double spec_rate = spec.seconds > 0 ? static_cast<double>(spec.tokens) / spec.seconds : 0.0;
      result["speculative"] = {
          {"block_size", block_size},
          {"verify", args.verification.kind == eval::Verification::Kind::kTree ? "tree" : "chain"},
          {"tree_nodes", args.verification.tree_nodes},
          {"tree_temperature", args.verification.tree_temperature},
          {"tokens", spec.tokens},
          {"seconds", spec.seconds},
          {"steps", spec.steps},
          {"tau", spec.steps > 0 ? static_cast<double>(spec.step_tokens) / static_cast<double>(spec.steps) : 0.0},
          {"ms_per_token", 1e3 * spec.seconds / static_cast<double>(std::max<int64_t>(1, spec.tokens))},
          {"ms_per_step", 1e3 * spec.seconds / static_cast<double>(std::max<int64_t>(1, spec.steps))},
          {"tokens_per_s", spec_rate},
          {"speedup", greedy_rate > 0 ? spec_rate / greedy_rate : 0.0},
          {"identical_prompts", spec.identical},
          {"near_tie_divergences", spec.near_ties},
          {"other_divergences", spec.other_divergences},
          {"prompts", prompts.size()},
          {"profiled_ms_per_step", phases_json(profile, static_cast<double>(profile.steps))},
          {"profiled_ms_per_token", phases_json(profile, static_cast<double>(profile.tokens))}};
    }
    if (!args.trace.empty()) {
      auto trace = [&](const std::string& what, const std::function<void()>& body) {
        const std::string path = args.trace + "-" + arm + "-" + what + ".json";
        std::string why;
        if (bench::trace_to(path, body, why)) result["traces"][what] = path;
        else std::cerr << "decode_bench: no trace of arm " << arm << " (" << what << "): " << why << "\n";
      };
      trace("greedy", [&] { eval::greedy_decode(target, prompts[0].ids, limits); });
      if (drafter)
        trace("speculative", [&] { eval::speculative_decode(target, *drafter, prompts[0].ids, limits, block_size, layer_ids, nullptr, args.verification); });
    }
    const nlohmann::json after = target.describe();
    result["target"] = {{"cuda_kernels", after.value("cuda_kernels", false)},
                        {"exact_decoding", after.value("exact_decoding", false)},
                        {"flash_decoding", after.value("flash_decoding", false)},
                        {"decode_graphs", after.value("decode_graphs", false)},
                        {"decode_graph_stats", after.value("decode_graph_stats", nlohmann::json::object())},
                        {"decode_graph_stats_after_greedy", graphs_after_greedy}};
    report["arms"].push_back(result);
    std::cerr << "decode_bench: arm " << arm << " done: " << result.dump() << "\n";
  }
  report["prompts"] = prompts.size();
  std::cout << report.dump(2) << "\n";
  if (!args.json.empty()) std::ofstream(args.json) << report.dump(2) << "\n";
  return 0;
}
