// The drafter's export against what z-lab's reference DFlashDraftModel
// (transformers) reads: config.json's fields and values, the tensor names and
// shapes of its state_dict, the default target layers, reading back exports
// of older builds, and the dump program the GPU check compares logits with
// (docs/drafter.md, "Serving: the reference DFlashDraftModel").
#include "checkpoint/checkpoint.h"
#include "export_format.h"
#include "memory_model.h"
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "support/expect.h"
#include "support/temp_dir.h"
#include "train/frozen_weights.h"

#include <dflash/sdk/safetensors_torch.hpp>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace {
using namespace dflash;
using host::NamedTensors;
namespace dd = dflash::drafter;

host::PluginRegistry& registry() {
  static host::PluginRegistry r = [] {
    host::PluginRegistry reg;
    reg.add_directory(DFLASH_INTREE_PLUGIN_DIR);
    return reg;
  }();
  return r;
}

nlohmann::json dflash_config(int64_t layers, int64_t block_size, int64_t mask_token) {
  return {{"num_layers", layers}, {"num_attention_heads", 0}, {"num_key_value_heads", 0}, {"head_dim", 0},
          {"intermediate_size", 0}, {"block_size", block_size}, {"max_anchors", 16}, {"gamma", 0.0},
          {"mask_token_id", mask_token}, {"target_layer_ids", nlohmann::json::array()}, {"init_std", 0.02},
          {"rope_theta", 0.0}, {"attention", "grouped"}, {"attention_group_blocks", 64}, {"attention_group_key_multiple", 128}, {"attention_kernel", "auto"},
          {"embedding_on_cpu", false}, {"activation_checkpointing", false}};
}

// A made-up target, as hf_decoder's describe() gives one: 8 layers, GQA 4:2.
const nlohmann::json kTarget = {{"num_layers", 8}, {"hidden_size", 16}, {"vocab_size", 40}, {"num_attention_heads", 4},
                                {"num_key_value_heads", 2}, {"head_dim", 8}, {"intermediate_size", 24},
                                {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 2048}};

std::unique_ptr<host::DrafterInstance> bound_drafter(int64_t layers, const std::string& dtype) {
  const auto& record = registry().find(DFLASH_KIND_DRAFTER, "dflash");
  auto d = std::make_unique<host::DrafterInstance>(record, dflash_config(layers, 16, -1), host::InstanceOptions{"cpu", dtype, 3});
  const auto type = dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat;
  d->bind_target(kTarget, {{"embed_tokens", torch::randn({40, 16}).to(type)}, {"lm_head", torch::randn({40, 16}).to(type)},
                           {"final_norm", torch::ones({16}).to(type)}});
  return d;
}

TEST(DFlashExport, DefaultTargetLayersAreTheReferencesBuildTargetLayerIds) {
  // Values of the reference's build_target_layer_ids(num_target_layers, num_draft_layers):
  // round(1 + i·(L − 4)/(n − 1)) with Python's round (half to even); one layer: L // 2.
  const std::vector<std::tuple<int64_t, int64_t, std::vector<int64_t>>> cases = {
      {36, 5, {1, 9, 17, 25, 33}},   // Qwen3-8B and its published 5-layer drafter
      {64, 5, {1, 16, 31, 46, 61}},  // Qwen3.6-27B
      {6, 2, {1, 3}},                // the quickstart target
      {8, 4, {1, 2, 4, 5}},          // 2.33 → 2, 3.67 → 4 (the old floor gave [1, 2, 3, 5])
      {7, 3, {1, 2, 4}},             // 2.5 → 2: half to even
      {9, 3, {1, 4, 6}},             // 3.5 → 4: half to even
      {28, 1, {14}},                 // one drafter layer: the middle of the target
      {48, 3, {1, 23, 45}}};
  for (const auto& [layers, count, expected] : cases)
    EXPECT_EQ(dd::default_target_layer_ids(layers, count), expected) << layers << " target layers, " << count << " ids";
}

TEST(DFlashExport, ConfigCarriesEveryFieldTheReferenceReads) {
  auto drafter = bound_drafter(3, "float32");
  const nlohmann::json c = *drafter->export_config();
  // Read by DFlashDraftModel itself.
  EXPECT_EQ(c.at("architectures"), (nlohmann::json{"DFlashDraftModel"}));
  EXPECT_EQ(c.at("auto_map"), (nlohmann::json{{"AutoModel", "dflash.DFlashDraftModel"}}));
  EXPECT_EQ(c.at("model_type"), "qwen3");
  EXPECT_EQ(c.at("num_hidden_layers"), 3);
  EXPECT_EQ(c.at("num_target_layers"), 8) << "evaluated by the reference even when target_layer_ids are given";
  EXPECT_EQ(c.at("block_size"), 16);
  const nlohmann::json& d = c.at("dflash_config");
  EXPECT_EQ(d.at("target_layer_ids"), (nlohmann::json{1, 3, 5})) << "the reference's default for 8 target layers, 3 ids";
  EXPECT_EQ(d.at("mask_token_id"), 39) << "−1 = the target's last id";
  EXPECT_EQ(d.at("block_size"), 16);
  // Read by the transformers Qwen3 modules it is built from, with Qwen3-8B's defaults otherwise.
  EXPECT_EQ(c.at("hidden_size"), 16);
  EXPECT_EQ(c.at("num_attention_heads"), 4);
  EXPECT_EQ(c.at("num_key_value_heads"), 2);
  EXPECT_EQ(c.at("head_dim"), 8);
  EXPECT_EQ(c.at("intermediate_size"), 24);
  EXPECT_EQ(c.at("hidden_act"), "silu");
  EXPECT_EQ(c.at("rms_norm_eps"), 1e-5) << "the target's";
  EXPECT_EQ(c.at("attention_bias"), false);
  EXPECT_EQ(c.at("attention_dropout"), 0.0);
  EXPECT_EQ(c.at("layer_types"), (nlohmann::json{"full_attention", "full_attention", "full_attention"}));
  EXPECT_EQ(c.at("use_sliding_window"), false);
  EXPECT_TRUE(c.at("sliding_window").is_null());
  EXPECT_EQ(c.at("rope_theta"), 10000.0);
  EXPECT_TRUE(c.at("rope_scaling").is_null());
  EXPECT_EQ(c.at("rope_parameters"), (nlohmann::json{{"rope_type", "default"}, {"rope_theta", 10000.0}}));
  EXPECT_EQ(c.at("max_position_embeddings"), 2048) << "the target's";
  EXPECT_EQ(c.at("vocab_size"), 40);
  EXPECT_EQ(c.at("tie_word_embeddings"), false);
  // The host's own reading of the drafter's facts (eval, the trainer) stays at the top level.
  EXPECT_EQ(c.at("target_layer_ids"), d.at("target_layer_ids"));
  EXPECT_EQ(c.at("mask_token_id"), d.at("mask_token_id"));
}

// The reference's state_dict, written down from its module structure:
// DFlashDraftModel has fc (Linear(len(target_layer_ids)·hidden → hidden, no
// bias)), hidden_norm and norm (RMSNorm(hidden)), and layers.i with
// input_layernorm, post_attention_layernorm, self_attn.{q,k,v,o}_proj (no
// bias), self_attn.{q,k}_norm (RMSNorm(head_dim)) and mlp.{gate,up,down}_proj;
// rotary_emb.inv_freq is not persistent. nn.Linear weights are [out, in].
std::map<std::string, std::vector<int64_t>> reference_state_dict(int64_t layers, int64_t features, int64_t h, int64_t heads,
                                                                 int64_t kv, int64_t d, int64_t inter) {
  std::map<std::string, std::vector<int64_t>> names = {
      {"fc.weight", {h, features * h}}, {"hidden_norm.weight", {h}}, {"norm.weight", {h}}};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    names[p + "input_layernorm.weight"] = {h};
    names[p + "post_attention_layernorm.weight"] = {h};
    names[p + "self_attn.q_proj.weight"] = {heads * d, h};
    names[p + "self_attn.k_proj.weight"] = {kv * d, h};
    names[p + "self_attn.v_proj.weight"] = {kv * d, h};
    names[p + "self_attn.o_proj.weight"] = {h, heads * d};
    names[p + "self_attn.q_norm.weight"] = {d};
    names[p + "self_attn.k_norm.weight"] = {d};
    names[p + "mlp.gate_proj.weight"] = {inter, h};
    names[p + "mlp.up_proj.weight"] = {inter, h};
    names[p + "mlp.down_proj.weight"] = {h, inter};
  }
  return names;
}

TEST(DFlashExport, CheckpointTensorsAreTheReferenceStateDict) {
  auto drafter = bound_drafter(3, "bfloat16");
  const auto expected = reference_state_dict(3, 3, 16, 4, 2, 8, 24);
  std::map<std::string, std::vector<int64_t>> ours;
  for (const auto& [name, tensor] : drafter->parameters()) ours[name] = tensor.sizes().vec();
  EXPECT_EQ(ours, expected);

  // What the checkpoint writer puts on disk: the same names, and the dtype under both spellings.
  test::TempDir temp("dflash_export");
  const std::string dir = checkpoint::save(temp.path().string(), 5, *drafter->export_config(), drafter->parameters(),
                                           {}, {{"step", 5}}, 1);
  auto file = sdk::safetensors::File::open(dir + "/model.safetensors");
  std::map<std::string, std::vector<int64_t>> saved;
  for (const auto& info : file->tensors()) {
    saved[info.name] = sdk::safetensors::load_tensor(file, info).sizes().vec();
    EXPECT_EQ(sdk::safetensors::load_tensor(file, info).scalar_type(), torch::kBFloat16) << info.name;
  }
  EXPECT_EQ(saved, expected);
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  EXPECT_EQ(config.at("dtype"), "bfloat16");
  EXPECT_EQ(config.at("torch_dtype"), "bfloat16");

  // Read back, the config gives the shape the weights were made with.
  const dd::ExportedDrafter back = dd::read_export_config(config);
  EXPECT_EQ(back.shape.layers, 3);
  EXPECT_EQ(back.shape.hidden, 16);
  EXPECT_EQ(back.shape.heads, 4);
  EXPECT_EQ(back.shape.kv_heads, 2);
  EXPECT_EQ(back.shape.head_dim, 8);
  EXPECT_EQ(back.shape.intermediate, 24);
  EXPECT_EQ(back.shape.feature_layers, 3);
  EXPECT_EQ(back.shape.rope_theta, 10000.0);
  EXPECT_EQ(back.shape.rms_norm_eps, 1e-5);
  EXPECT_EQ(back.layer_ids, (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(back.block_size, 16);
  EXPECT_EQ(back.mask_token, 39);
  EXPECT_EQ(back.target_layers, 8);
}

TEST(DFlashExport, ConfigsOfOlderBuildsStillReadBack) {
  // config.json as builds before the reference format wrote it: no
  // num_target_layers, layer_types or rope_parameters; DFlash fields at the top level too.
  nlohmann::json old = nlohmann::json::parse(R"({
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 192,
    "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 64, "intermediate_size": 512, "vocab_size": 260,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "block_size": 8, "target_layer_ids": [1, 3], "mask_token_id": 259,
    "dflash_config": {"block_size": 8, "target_layer_ids": [1, 3], "mask_token_id": 259, "gamma": 4.0, "max_anchors": 48},
    "torch_dtype": "float32"})");
  dd::ExportedDrafter e = dd::read_export_config(old);
  EXPECT_EQ(e.shape.layers, 2);
  EXPECT_EQ(e.shape.hidden, 192);
  EXPECT_EQ(e.layer_ids, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(e.mask_token, 259);
  EXPECT_EQ(e.target_layers, 0) << "not recorded by older builds";
  old.erase("dflash_config");  // only at the top level
  EXPECT_EQ(dd::read_export_config(old).block_size, 8);
  // A z-lab-style config: DFlash fields only under dflash_config, RoPE only in rope_parameters.
  nlohmann::json published = old;
  published.erase("target_layer_ids");
  published.erase("mask_token_id");
  published.erase("rope_theta");
  published["dflash_config"] = {{"target_layer_ids", {1, 3}}, {"mask_token_id", 259}};
  published["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  e = dd::read_export_config(published);
  EXPECT_EQ(e.layer_ids, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(e.shape.rope_theta, 5e5);
  // A missing field is named.
  auto error_of = [](const nlohmann::json& config) {
    try {
      dd::read_export_config(config);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  published.erase("head_dim");
  EXPECT_CONTAINS(error_of(published), "config.json has no \"head_dim\"");
  published["head_dim"] = 64;
  published["dflash_config"].erase("target_layer_ids");
  EXPECT_CONTAINS(error_of(published), "no \"target_layer_ids\", in dflash_config or at the top level");
}

struct Quickstart {
  std::unique_ptr<host::TargetModelInstance> target;
  std::unique_ptr<host::DrafterInstance> drafter;
};
Quickstart quickstart() {
  Quickstart q;
  const auto& record = registry().find(DFLASH_KIND_TARGET_MODEL, "hf_decoder");
  q.target = std::make_unique<host::TargetModelInstance>(
      record,
      nlohmann::json{{"path", DFLASH_CONFIGS_DIR "/quickstart/target"}, {"dtype", "auto"}, {"feature_layers", 2},
                     {"kernels", "auto"}, {"streams", 2}, {"attention", "auto"}},
      host::InstanceOptions{"cpu", "float32", 0});
  q.drafter = std::make_unique<host::DrafterInstance>(registry().find(DFLASH_KIND_DRAFTER, "dflash"),
                                                      dflash_config(2, 8, 259), host::InstanceOptions{"cpu", "float32", 11});
  q.drafter->bind_target(q.target->describe(), host::place_frozen_weights(q.target->frozen_weights(), "hf_decoder",
                                                                          torch::kCPU, torch::kFloat));
  return q;
}

int run(const std::string& args, const std::string& log) {
  const std::string command = std::string(DFLASH_REFERENCE_DUMP_EXE) + " --plugin-dir " DFLASH_INTREE_PLUGIN_DIR + " " + args +
                              " > " + log + " 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_text(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

TEST(DFlashExport, ReferenceDumpWritesOurLogitsFromBothPaths) {
  Quickstart q = quickstart();
  test::TempDir temp("dflash_dump");
  const std::string root = temp.path().string();
  // Weights away from their initial values, so the layers do real work.
  {
    const torch::NoGradGuard no_grad;
    torch::manual_seed(5);
    for (const auto& [name, p] : q.drafter->parameters()) p.add_(torch::randn_like(p) * 0.05);
  }
  checkpoint::save(root + "/run", 1, *q.drafter->export_config(), q.drafter->parameters(), {}, {{"step", 1}}, 1);
  const std::string out = root + "/dump.safetensors", log = root + "/log.txt";
  const std::string target = " --target " DFLASH_CONFIGS_DIR "/quickstart/target";
  ASSERT_EQ(run(target + " --drafter " + root + "/run --out " + out + " --prompts " DFLASH_CONFIGS_DIR
                "/quickstart/data/heldout.jsonl --contexts 5,20,41",
                log),
            0)
      << read_text(log);
  EXPECT_CONTAINS(read_text(log), "our two paths (drafting, training forward) differ by max |Δ logit|");

  auto file = sdk::safetensors::File::open(out);
  auto get = [&](const char* name) { return sdk::safetensors::load_tensor(file, name); };
  const nlohmann::json meta = nlohmann::json::parse(file->metadata().at("dflash_reference_dump"));
  EXPECT_EQ(meta.at("target_layer_ids"), (nlohmann::json{1, 3}));
  EXPECT_EQ(meta.at("block_size"), 8);
  EXPECT_EQ(meta.at("mask_token_id"), 259);
  EXPECT_EQ(meta.at("dtype"), "float32");
  EXPECT_EQ(meta.at("context_lengths"), (nlohmann::json{5, 20, 41}));

  // The prompt and the blocks: the token at each context length, then the mask.
  const auto ids = get("input_ids");
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{42}));
  const auto blocks = get("block_ids");
  ASSERT_EQ(blocks.sizes(), (std::vector<int64_t>{3, 8}));
  const std::vector<int64_t> contexts = {5, 20, 41};
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(blocks[j][0].item<int64_t>(), ids[contexts[j]].item<int64_t>());
    EXPECT_TRUE(blocks[j].slice(0, 1).eq(259).all().item<bool>());
  }
  // The features are the target's hidden states of layers 1 and 3, concatenated.
  const NamedTensors hidden = q.target->forward({{"input_ids", ids.view({1, 42})}}, {1, 3}, false, false);
  const auto features = get("context_features");
  EXPECT_TRUE(torch::equal(features, torch::cat({hidden[0].second[0], hidden[1].second[0]}, -1)));

  // Both paths, and the logits are the hidden states through the target's lm_head.
  const auto lm_head = host::place_frozen_weights(q.target->frozen_weights(), "hf_decoder", torch::kCPU, torch::kFloat);
  at::Tensor head;
  for (const auto& [name, t] : lm_head)
    if (name == "lm_head") head = t;
  for (const char* path : {"draft", "train"}) {
    const auto h = get((std::string(path) + ".hidden").c_str()), logits = get((std::string(path) + ".logits").c_str());
    ASSERT_EQ(h.sizes(), (std::vector<int64_t>{3, 8, 192})) << path;
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{3, 8, 260})) << path;
    EXPECT_TRUE(torch::allclose(logits, torch::matmul(h, head.t()), 1e-5, 1e-5)) << path;
  }
  // The cached drafting path, its context grown block after block, gives the training forward's logits.
  EXPECT_TRUE(torch::allclose(get("draft.logits"), get("train.logits"), 1e-4, 1e-4))
      << (get("draft.logits") - get("train.logits")).abs().max().item<double>();
  // And they are the plugin's own drafting: its greedy proposal after the first context is the argmax.
  const int64_t session = q.drafter->draft_begin();
  q.drafter->draft_extend(session, {{"input_ids", ids.slice(0, 0, 5)},
                                    {"hidden.1", hidden[0].second[0].slice(0, 0, 5)},
                                    {"hidden.3", hidden[1].second[0].slice(0, 0, 5)}});
  const auto proposal = q.drafter->draft_propose(session, {{"last_token", ids.slice(0, 5, 6)}}, 7);
  q.drafter->draft_end(session);
  EXPECT_TRUE(torch::equal(proposal, get("draft.logits")[0].slice(0, 1).argmax(-1)));
}

TEST(DFlashExport, ReferenceDumpRefusesAnExportThatDoesNotMatchItsConfig) {
  Quickstart q = quickstart();
  test::TempDir temp("dflash_dump_bad");
  const std::string root = temp.path().string(), log = root + "/log.txt";
  const std::string args = " --target " DFLASH_CONFIGS_DIR "/quickstart/target --drafter " + root + "/run --out " + root + "/d.st";
  NamedTensors weights = q.drafter->parameters();
  weights.pop_back();  // norm.weight
  checkpoint::save(root + "/run", 1, *q.drafter->export_config(), weights, {}, {{"step", 1}}, 1);
  EXPECT_EQ(run(args, log), 1);
  EXPECT_CONTAINS(read_text(log), "model.safetensors: no tensor 'norm.weight'");
  weights = q.drafter->parameters();
  weights.emplace_back("lm_head.weight", torch::zeros({260, 192}));
  checkpoint::save(root + "/run", 2, *q.drafter->export_config(), weights, {}, {{"step", 2}}, 1);
  EXPECT_EQ(run(args, log), 1);
  EXPECT_CONTAINS(read_text(log), "model.safetensors: unexpected tensor 'lm_head.weight'");
  EXPECT_EQ(run(args + " --contexts 9,3", log), 2);
  EXPECT_CONTAINS(read_text(log), "--contexts must be strictly ascending");
}

}  // namespace
