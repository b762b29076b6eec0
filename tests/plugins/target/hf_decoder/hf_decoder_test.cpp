// target/hf_decoder on tiny checkpoints written here (config.json +
// safetensors, random weights), against a naive implementation written
// independently in this file: per-head attention with explicit scores, rotary
// embeddings on (i, i + d/2) pairs, documents separated by an explicit mask.
// Parity with Hugging Face transformers itself: tests/plugins/target/hf_decoder/hf_parity_test.cpp.
#include "memory/memory_stats.h"
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

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace dflash::host;

namespace {

struct TinySpec {
  std::string model_type = "qwen3";
  int64_t hidden = 24, inter = 40, layers = 4, heads = 4, kv_heads = 2, head_dim = 8, vocab = 50;
  bool tied = false, bias = false, llama3_scaling = false;
};

using Weights = std::vector<std::pair<std::string, torch::Tensor>>;

Weights make_weights(const TinySpec& t) {
  torch::manual_seed(11);
  Weights w;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, double scale) {
    w.emplace_back(n, torch::randn(shape) * scale);
  };
  add("model.embed_tokens.weight", {t.vocab, t.hidden}, 1.0);
  add("model.norm.weight", {t.hidden}, 0.2);
  w.back().second += 1.0;
  if (!t.tied) add("lm_head.weight", {t.vocab, t.hidden}, 0.3);
  for (int64_t i = 0; i < t.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const double s = 1.0 / std::sqrt(static_cast<double>(t.hidden));
    add(p + "input_layernorm.weight", {t.hidden}, 0.1);
    w.back().second += 1.0;
    add(p + "post_attention_layernorm.weight", {t.hidden}, 0.1);
    w.back().second += 1.0;
    add(p + "self_attn.q_proj.weight", {t.heads * t.head_dim, t.hidden}, s);
    add(p + "self_attn.k_proj.weight", {t.kv_heads * t.head_dim, t.hidden}, s);
    add(p + "self_attn.v_proj.weight", {t.kv_heads * t.head_dim, t.hidden}, s);
    add(p + "self_attn.o_proj.weight", {t.hidden, t.heads * t.head_dim}, s);
    if (t.bias) {
      add(p + "self_attn.q_proj.bias", {t.heads * t.head_dim}, 0.1);
      add(p + "self_attn.k_proj.bias", {t.kv_heads * t.head_dim}, 0.1);
      add(p + "self_attn.v_proj.bias", {t.kv_heads * t.head_dim}, 0.1);
    }
    if (t.model_type == "qwen3") {
      add(p + "self_attn.q_norm.weight", {t.head_dim}, 0.1);
      w.back().second += 1.0;
      add(p + "self_attn.k_norm.weight", {t.head_dim}, 0.1);
      w.back().second += 1.0;
    }
    add(p + "mlp.gate_proj.weight", {t.inter, t.hidden}, s);
    add(p + "mlp.up_proj.weight", {t.inter, t.hidden}, s);
    add(p + "mlp.down_proj.weight", {t.hidden, t.inter}, 1.0 / std::sqrt(static_cast<double>(t.inter)));
  }
  return w;
}

nlohmann::json config_json(const TinySpec& t) {
  nlohmann::json c = {{"model_type", t.model_type}, {"hidden_size", t.hidden}, {"intermediate_size", t.inter},
                      {"num_hidden_layers", t.layers}, {"num_attention_heads", t.heads},
                      {"num_key_value_heads", t.kv_heads}, {"head_dim", t.head_dim}, {"vocab_size", t.vocab},
                      {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"tie_word_embeddings", t.tied},
                      {"torch_dtype", "float32"}};
  if (t.llama3_scaling)
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}};
  return c;
}

fs::path write_model(const fs::path& dir, const TinySpec& t, const Weights& w, int shards = 1) {
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir / "config.json") << config_json(t).dump(2);
  namespace st = dflash::sdk::safetensors;
  if (shards == 1) {
    st::save_tensors(dir / "model.safetensors", w, {{"format", "pt"}});
  } else {
    nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    for (int s = 0; s < shards; ++s) {
      Weights part;
      for (size_t i = s; i < w.size(); i += shards) part.push_back(w[i]);
      const std::string name = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
      st::save_tensors(dir / name, part);
      for (const auto& [n, tensor] : part) index["weight_map"][n] = name;
    }
    std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
  }
  return dir;
}

// ---- the naive reference -----------------------------------------------------
torch::Tensor naive_rms(const torch::Tensor& x, const torch::Tensor& w) {
  return w * (x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-6));
}

torch::Tensor naive_inv_freq(const TinySpec& t) {
  std::vector<double> inv;
  for (int64_t i = 0; i < t.head_dim / 2; ++i) {
    double f = std::pow(10000.0, -2.0 * i / t.head_dim);
    if (t.llama3_scaling) {
      const double wavelen = 2 * M_PI / f, low = 16.0 / 1.0, high = 16.0 / 4.0;
      if (wavelen > low) f = f / 8.0;
      else if (wavelen >= high) {
        const double smooth = (16.0 / wavelen - 1.0) / (4.0 - 1.0);
        f = (1 - smooth) * f / 8.0 + smooth * f;
      }
    }
    inv.push_back(f);
  }
  return torch::tensor(inv, torch::kDouble);
}

// Rotates each (j, j + d/2) pair of x [S, d] by angle position·freq_j.
torch::Tensor naive_rope(const torch::Tensor& x, const torch::Tensor& positions, const torch::Tensor& inv) {
  const int64_t half = x.size(-1) / 2;
  auto out = x.clone();
  for (int64_t j = 0; j < half; ++j) {
    auto angle = positions.to(torch::kDouble) * inv[j];
    auto a = x.select(-1, j), b = x.select(-1, j + half);
    out.select(-1, j).copy_(a * angle.cos() - b * angle.sin());
    out.select(-1, j + half).copy_(b * angle.cos() + a * angle.sin());
  }
  return out;
}

// Hidden states after each layer for one sequence ids [S] with positions [S] and documents [S].
std::vector<torch::Tensor> naive_forward(const TinySpec& t, const Weights& weights, const torch::Tensor& ids,
                                         const torch::Tensor& positions, const torch::Tensor& documents) {
  std::map<std::string, torch::Tensor> w;
  for (const auto& [n, tensor] : weights) w[n] = tensor.to(torch::kDouble);
  const int64_t s = ids.size(0);
  const auto inv = naive_inv_freq(t);
  auto x = w["model.embed_tokens.weight"].index_select(0, ids);
  std::vector<torch::Tensor> outs;
  for (int64_t l = 0; l < t.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto h = naive_rms(x, w[p + "input_layernorm.weight"]);
    auto proj = [&](const std::string& n) {
      auto y = torch::matmul(h, w[p + n + ".weight"].t());
      return t.bias ? y + w[p + n + ".bias"] : y;
    };
    auto q = proj("self_attn.q_proj"), k = proj("self_attn.k_proj"), v = proj("self_attn.v_proj");
    std::vector<torch::Tensor> heads;
    for (int64_t head = 0; head < t.heads; ++head) {
      const int64_t kv = head / (t.heads / t.kv_heads);
      auto qh = q.narrow(1, head * t.head_dim, t.head_dim), kh = k.narrow(1, kv * t.head_dim, t.head_dim);
      auto vh = v.narrow(1, kv * t.head_dim, t.head_dim);
      if (t.model_type == "qwen3") {
        qh = naive_rms(qh, w[p + "self_attn.q_norm.weight"]);
        kh = naive_rms(kh, w[p + "self_attn.k_norm.weight"]);
      }
      qh = naive_rope(qh, positions, inv);
      kh = naive_rope(kh, positions, inv);
      auto scores = torch::matmul(qh, kh.t()) / std::sqrt(static_cast<double>(t.head_dim));
      for (int64_t i = 0; i < s; ++i)
        for (int64_t j = 0; j < s; ++j)
          if (j > i || documents[i].item<int64_t>() != documents[j].item<int64_t>())
            scores[i][j] = -std::numeric_limits<double>::infinity();
      heads.push_back(torch::matmul(torch::softmax(scores, 1), vh));
    }
    x = x + torch::matmul(torch::cat(heads, 1), w[p + "self_attn.o_proj.weight"].t());
    auto m = naive_rms(x, w[p + "post_attention_layernorm.weight"]);
    auto gate = torch::matmul(m, w[p + "mlp.gate_proj.weight"].t());
    x = x + torch::matmul(gate * torch::sigmoid(gate) * torch::matmul(m, w[p + "mlp.up_proj.weight"].t()),
                          w[p + "mlp.down_proj.weight"].t());
    outs.push_back(x);
  }
  outs.push_back(naive_rms(x, w["model.norm.weight"]));
  return outs;
}

class HfDecoder : public ::testing::Test {
 protected:
  void SetUp() override {
    temp_ = std::make_unique<dflash::test::TempDir>("dflash_hf");
    dir_ = temp_->path();
    registry_ = std::make_unique<PluginRegistry>();
    registry_->add_directory(DFLASH_INTREE_PLUGIN_DIR);
  }
  void TearDown() override { temp_.reset(); }
  std::unique_ptr<TargetModelInstance> load(const fs::path& model, int64_t feature_layers = 3) {
    return std::make_unique<TargetModelInstance>(
        registry_->find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"),
        nlohmann::json{{"path", model.string()}, {"dtype", "float64"}, {"feature_layers", feature_layers}},
        InstanceOptions{"cpu", "float64", 0});
  }
  std::unique_ptr<dflash::test::TempDir> temp_;
  fs::path dir_;
  std::unique_ptr<PluginRegistry> registry_;
};

torch::Tensor get(const NamedTensors& t, const std::string& name) {
  for (const auto& [n, tensor] : t)
    if (n == name) return tensor;
  ADD_FAILURE() << "missing " << name;
  return {};
}

void check_against_naive(TargetModelInstance& target, const TinySpec& t, const Weights& w) {
  torch::manual_seed(3);
  const int64_t s = 9;
  auto ids = torch::randint(0, t.vocab, {2, s}, torch::kLong);
  // Row 0: one document; row 1: documents of 4 and 5 tokens (positions restart).
  auto positions = torch::stack({torch::arange(s), torch::cat({torch::arange(4), torch::arange(5)})});
  std::vector<int64_t> all_layers;
  for (int64_t l = 0; l < t.layers; ++l) all_layers.push_back(l);
  NamedTensors out = target.forward({{"input_ids", ids}, {"position_ids", positions}}, all_layers, true, true);
  for (int64_t row = 0; row < 2; ++row) {
    const auto documents = row == 0 ? torch::zeros({s}, torch::kLong) : torch::cat({torch::zeros({4}, torch::kLong), torch::ones({5}, torch::kLong)});
    auto expected = naive_forward(t, w, ids[row], positions[row], documents);
    for (int64_t l = 0; l < t.layers; ++l) {
      auto got = get(out, "hidden." + std::to_string(l))[row];
      EXPECT_TRUE(torch::allclose(got, expected[l], 1e-9, 1e-9)) << "layer " << l << " row " << row << " max diff "
                                                                  << (got - expected[l]).abs().max().item<double>();
    }
    EXPECT_TRUE(torch::allclose(get(out, "last_hidden")[row], expected.back(), 1e-9, 1e-9));
  }
  EXPECT_EQ(get(out, "logits").sizes(), (std::vector<int64_t>{2, s, t.vocab}));
  EXPECT_FALSE(get(out, "hidden.0").requires_grad());
}

TEST_F(HfDecoder, Qwen3WithQkNormGqaAndHeadDimMatchesTheNaiveModel) {
  TinySpec t;
  const Weights w = make_weights(t);
  auto target = load(write_model(dir_, t, w));
  check_against_naive(*target, t, w);
  const auto info = target->describe();
  EXPECT_EQ(info.at("num_layers"), 4);
  EXPECT_EQ(info.at("default_layer_ids"), (nlohmann::json{1, 1, 1})) << "L − 3 = 1: all at layer 1";
}

TEST_F(HfDecoder, LlamaWithLlama3RopeScalingTiedEmbeddingsMatches) {
  TinySpec t;
  t.model_type = "llama";
  t.heads = 3;
  t.kv_heads = 1;
  t.tied = true;
  t.llama3_scaling = true;
  t.layers = 8;
  const Weights w = make_weights(t);
  auto target = load(write_model(dir_, t, w));
  check_against_naive(*target, t, w);
  NamedTensors frozen = target->frozen_weights();
  EXPECT_TRUE(torch::equal(get(frozen, "lm_head"), get(frozen, "embed_tokens"))) << "tied";
  EXPECT_EQ(target->describe().at("default_layer_ids"), (nlohmann::json{1, 3, 5}));
}

TEST_F(HfDecoder, Qwen2WithBiasesFromShardsMatches) {
  TinySpec t;
  t.model_type = "qwen2";
  t.bias = true;
  const Weights w = make_weights(t);
  auto target = load(write_model(dir_, t, w, /*shards=*/3));
  check_against_naive(*target, t, w);
}

TEST_F(HfDecoder, PackedDocumentsEqualSeparateRunsWithDocumentIdsOrPositions) {
  TinySpec t;
  const Weights w = make_weights(t);
  auto target = load(write_model(dir_, t, w));
  auto a = torch::randint(0, t.vocab, {1, 5}, torch::kLong), b = torch::randint(0, t.vocab, {1, 7}, torch::kLong);
  auto packed = torch::cat({a, b}, 1);
  auto alone_a = get(target->forward({{"input_ids", a}}, {2}, false, false), "hidden.2");
  auto alone_b = get(target->forward({{"input_ids", b}}, {2}, false, false), "hidden.2");
  auto by_documents = get(target->forward({{"input_ids", packed},
                                           {"document_ids", torch::cat({torch::zeros({1, 5}), torch::ones({1, 7})}, 1).to(torch::kLong)}},
                                          {2}, false, false), "hidden.2");
  auto by_positions = get(target->forward({{"input_ids", packed},
                                           {"position_ids", torch::cat({torch::arange(5), torch::arange(7)}).unsqueeze(0)}},
                                          {2}, false, false), "hidden.2");
  for (const auto& packed_out : {by_documents, by_positions}) {
    EXPECT_TRUE(torch::allclose(packed_out.narrow(1, 0, 5), alone_a, 1e-10, 1e-10));
    EXPECT_TRUE(torch::allclose(packed_out.narrow(1, 5, 7), alone_b, 1e-10, 1e-10));
  }
}

TEST_F(HfDecoder, BadCheckpointsFailClearly) {
  TinySpec t;
  Weights w = make_weights(t);
  auto expect_create_error = [&](const fs::path& model, const std::string& fragment) {
    try {
      load(model);
      ADD_FAILURE() << "loaded a bad checkpoint: " << fragment;
    } catch (const PluginCallError& e) {
      EXPECT_CONTAINS(e.what(), fragment);
      EXPECT_CONTAINS(e.what(), "target model plugin 'hf_decoder'");
    }
  };
  expect_create_error(dir_ / "nowhere", "config.json: cannot open");
  // A missing tensor.
  Weights missing = w;
  missing.erase(missing.begin() + 5);
  expect_create_error(write_model(dir_ / "missing", t, missing), "tensor '" + w[5].first + "' is missing");
  // A misshapen tensor, named with its file.
  Weights misshapen = w;
  misshapen[0].second = torch::randn({t.vocab + 1, t.hidden});
  expect_create_error(write_model(dir_ / "misshapen", t, misshapen),
                      "model.safetensors: tensor 'model.embed_tokens.weight' has shape [51, 24], config.json implies [50, 24]");
  // Unsupported architecture and a bad key.
  write_model(dir_ / "gpt2", t, w);
  auto config = config_json(t);
  config["model_type"] = "gpt2";
  std::ofstream(dir_ / "gpt2" / "config.json") << config.dump();
  expect_create_error(dir_ / "gpt2", "model_type: 'gpt2' is not supported");
  config = config_json(t);
  config["num_key_value_heads"] = 3;
  write_model(dir_ / "kv", t, w);
  std::ofstream(dir_ / "kv" / "config.json") << config.dump();
  expect_create_error(dir_ / "kv", "num_key_value_heads: 3 does not divide num_attention_heads 4");
  // A truncated safetensors file.
  write_model(dir_ / "truncated", t, w);
  {
    const fs::path file = dir_ / "truncated" / "model.safetensors";
    struct stat st {};
    ::stat(file.c_str(), &st);
    ASSERT_EQ(::truncate(file.c_str(), st.st_size - 10), 0);
  }
  expect_create_error(dir_ / "truncated", "the file is truncated");
}

// The GPU path (our kernels + flash attention over documents) against the
// fp64 naive model, beside the ATen reference path in the same dtype: the
// GPU path's error must stay within twice the reference path's (+ a floor for
// bf16 rounding noise). Shapes cover the vectorised kernels (widths that are
// multiples of 8), the scalar ones, a head_dim flash attention needs padded
// (12), q/k norm, biases, GQA, packed rows, and 1, 2 or more streams than
// rows (micro-batches of uneven size).
TEST_F(HfDecoder, CudaKernelsMatchTheNaiveModelAsCloselyAsTheReferencePath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TinySpec wide;  // Qwen3: q/k norm, vectorised widths
  wide.hidden = 64;
  wide.inter = 96;
  wide.head_dim = 16;
  TinySpec narrow;  // Qwen2: biases, odd widths, head_dim 12, 3 q heads per kv head
  narrow.model_type = "qwen2";
  narrow.bias = true;
  narrow.hidden = 36;
  narrow.inter = 52;
  narrow.heads = 6;
  narrow.kv_heads = 2;
  narrow.head_dim = 12;
  int index = 0;
  for (const TinySpec& t : {wide, narrow}) {
    SCOPED_TRACE(t.model_type);
    const Weights w = make_weights(t);
    const fs::path model = write_model(dir_ / ("gpu" + std::to_string(index++)), t, w);
    torch::manual_seed(5);
    // Three rows (split 1 + 2 over two streams): one, two and three documents.
    const int64_t s = 40;
    const std::vector<std::vector<int64_t>> lengths = {{40}, {17, 23}, {5, 30, 5}};
    auto ids = torch::randint(0, t.vocab, {3, s}, torch::kLong);
    std::vector<torch::Tensor> position_rows;
    for (const auto& row : lengths) {
      std::vector<torch::Tensor> parts;
      for (int64_t len : row) parts.push_back(torch::arange(len));
      position_rows.push_back(torch::cat(parts));
    }
    auto positions = torch::stack(position_rows);
    std::vector<int64_t> layers;
    for (int64_t l = 0; l < t.layers; ++l) layers.push_back(l);
    std::vector<std::vector<torch::Tensor>> expected;
    for (int64_t row = 0; row < 3; ++row) {
      std::vector<torch::Tensor> parts;
      for (size_t d = 0; d < lengths[row].size(); ++d) parts.push_back(torch::full({lengths[row][d]}, static_cast<int64_t>(d), torch::kLong));
      expected.push_back(naive_forward(t, w, ids[row], positions[row], torch::cat(parts)));
    }
    auto run = [&](const std::string& kernels, int streams, const std::string& attention = "auto") {
      TargetModelInstance target(registry_->find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"),
                                 {{"path", model.string()}, {"dtype", "bfloat16"}, {"feature_layers", 3},
                                  {"kernels", kernels}, {"streams", streams}, {"attention", attention}},
                                 InstanceOptions{"cuda:0", "bfloat16", 0});
      EXPECT_EQ(target.describe().at("cuda_kernels").get<bool>(), kernels == "auto");
      // cuDNN's attention is expected to work on the GPU machines this runs on (H100/H200).
      EXPECT_EQ(target.describe().at("cudnn_attention").get<bool>(), kernels == "auto" && attention == "auto");
      return target.forward({{"input_ids", ids}, {"position_ids", positions}}, layers, true, false);
    };
    const NamedTensors reference = run("aten", 1);
    auto error = [&](const NamedTensors& out, const std::string& name, int64_t l) {
      double worst = 0;
      for (int64_t row = 0; row < 3; ++row) {
        const auto truth = expected[row][l];
        const auto got = get(out, name)[row].to(torch::kCPU, torch::kDouble);
        worst = std::max(worst, ((got - truth).abs().max() / truth.abs().max()).item<double>());
      }
      return worst;
    };
    // Two streams: row 0 alone (one document: cuDNN) and rows 1–2 (packed: flash);
    // 8 streams: one row each; 1 stream: all three rows packed (flash).
    for (const auto& [streams, attention] : std::vector<std::pair<int, std::string>>{{1, "auto"}, {2, "auto"}, {8, "auto"}, {8, "flash"}}) {
      SCOPED_TRACE("streams " + std::to_string(streams) + ", attention " + attention);
      const NamedTensors fast = run("auto", streams, attention);
      for (int64_t l = 0; l <= t.layers; ++l) {
        const std::string name = l < t.layers ? "hidden." + std::to_string(l) : "last_hidden";
        const double e_fast = error(fast, name, l), e_ref = error(reference, name, l);
        EXPECT_LE(e_fast, 2 * e_ref + 4e-3) << name << ": kernels " << e_fast << ", ATen path " << e_ref;
        EXPECT_LE(e_fast, 3e-2) << name;
      }
    }
  }
}

// The GPU forward runs its row groups on CUDA streams it keeps, so cuBLAS's
// per-stream workspace is allocated once: repeated forwards (a training run's
// target, step after step) end with exactly the memory the first left, and
// the plan names the streams (fact forward_streams) for the host to count
// their workspaces. Fresh pool streams every forward grew the allocated
// memory by a workspace per stream and step (issue 40, item 8).
TEST_F(HfDecoder, RepeatedGpuForwardsAllocateNoNewStreamWorkspaces) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TinySpec t;
  t.hidden = 64;
  t.inter = 96;
  t.head_dim = 16;
  const fs::path model = write_model(dir_ / "streams", t, make_weights(t));
  const nlohmann::json section = {{"path", model.string()}, {"dtype", "bfloat16"}, {"feature_layers", 3},
                                  {"kernels", "auto"},      {"streams", 3},        {"attention", "auto"},
                                  {"decode_graphs", "auto"}, {"exact_decoding", "auto"}};
  const PluginMemoryPlan plan = plan_memory(registry_->find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"), section,
                                            InstanceOptions{"cuda:0", "bfloat16", 0}, {{"rows", 4}, {"row_length", 40}});
  ASSERT_TRUE(plan.available);
  EXPECT_EQ(plan.facts.at("forward_streams").get<int64_t>(), 3);  // min(streams, rows)
  const PluginMemoryPlan one_row = plan_memory(registry_->find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"), section,
                                               InstanceOptions{"cuda:0", "bfloat16", 0}, {{"rows", 1}, {"row_length", 40}});
  EXPECT_EQ(one_row.facts.at("forward_streams").get<int64_t>(), 0);  // one group runs on the caller's stream

  TargetModelInstance target(registry_->find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"), section,
                             InstanceOptions{"cuda:0", "bfloat16", 0});
  ASSERT_TRUE(target.describe().at("cuda_kernels").get<bool>());
  const auto ids = torch::randint(0, t.vocab, {4, 40}, torch::kLong);
  const auto positions = torch::arange(40).repeat({4, 1});
  auto forward_and_measure = [&] {
    { const NamedTensors out = target.forward({{"input_ids", ids}, {"position_ids", positions}}, {0, 1}, true, false); }
    torch::cuda::synchronize();
    return dflash::memory::memory_now(c10::Device("cuda:0")).current_bytes;
  };
  const int64_t after_first = forward_and_measure();
  // More forwards than LibTorch's pool has streams per device (32) / groups.
  for (int i = 0; i < 12; ++i) EXPECT_EQ(forward_and_measure(), after_first) << "forward " << i + 2;
}

// The frozen tensors for a drafter device: a detached copy in the drafter's
// dtype (tied weights copied once), or the target's own tensor when it
// already sits there in that dtype.
TEST_F(HfDecoder, FrozenWeightsArePlacedAsCopiesOrSharedOnTheSameDevice) {
  TinySpec t;
  t.tied = true;
  auto target = load(write_model(dir_, t, make_weights(t)));
  const NamedTensors frozen = target->frozen_weights();
  const NamedTensors placed = place_frozen_weights(frozen, "hf_decoder", torch::kCPU, torch::kFloat);
  ASSERT_EQ(placed.size(), 3u);
  for (const auto& [name, copy] : placed) {
    SCOPED_TRACE(name);
    const auto original = get(frozen, name);
    EXPECT_NE(copy.data_ptr(), original.data_ptr());
    EXPECT_EQ(copy.scalar_type(), torch::kFloat);
    EXPECT_FALSE(copy.requires_grad());
    EXPECT_TRUE(torch::allclose(copy.to(torch::kDouble), original, 1e-6, 1e-6));
  }
  EXPECT_EQ(get(placed, "lm_head").data_ptr(), get(placed, "embed_tokens").data_ptr()) << "tied: one copy";
  get(placed, "final_norm").add_(1.0);
  EXPECT_TRUE(torch::equal(get(target->frozen_weights(), "final_norm"), get(frozen, "final_norm")))
      << "the target's tensor must not change with the copy";
  NamedTensors missing(frozen.begin(), frozen.end());
  missing.erase(std::remove_if(missing.begin(), missing.end(), [](const auto& p) { return p.first == "final_norm"; }),
                missing.end());
  try {
    place_frozen_weights(missing, "hf_decoder", torch::kCPU, torch::kFloat);
    ADD_FAILURE() << "accepted a target without final_norm";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "target model plugin 'hf_decoder': frozen_weights returned no 'final_norm'");
  }
  // Same device, same dtype: shared, detached, never requiring grad.
  const NamedTensors shared = place_frozen_weights(frozen, "hf_decoder", torch::kCPU, torch::kDouble);
  for (const auto& [name, tensor] : shared) {
    EXPECT_EQ(tensor.data_ptr(), get(frozen, name).data_ptr()) << name;
    EXPECT_FALSE(tensor.requires_grad()) << name;
  }
  if (torch::cuda::is_available()) {
    const NamedTensors on_gpu = place_frozen_weights(frozen, "hf_decoder", torch::Device(torch::kCUDA, 0), torch::kBFloat16);
    for (const auto& [name, copy] : on_gpu) EXPECT_TRUE(copy.is_cuda()) << name;
  }
}

// exact_decoding: on refuses, naming the setting, where it cannot hold (here:
// the CPU, or the ATen path on a GPU); auto there runs the usual path.
TEST_F(HfDecoder, ExactDecodingWhereItCannotHoldIsRefusedByName) {
  TinySpec t;
  const fs::path model = write_model(dir_, t, make_weights(t));
  auto refused = [&](const std::string& device, const std::string& kernels) {
    try {
      TargetModelInstance target(registry_->find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"),
                                 {{"path", model.string()}, {"dtype", "auto"}, {"feature_layers", 2},
                                  {"kernels", kernels}, {"exact_decoding", "on"}},
                                 InstanceOptions{device, device == "cpu" ? "float32" : "bfloat16", 0});
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string on_cpu = refused("cpu", "auto");
  EXPECT_CONTAINS(on_cpu, "exact_decoding: on needs the GPU decoding path");
  EXPECT_CONTAINS(on_cpu, "set exact_decoding: auto or off");
  if (torch::cuda::is_available()) EXPECT_CONTAINS(refused("cuda:0", "aten"), "exact_decoding: on needs");
  // auto (the default) takes the usual path where the kernels cannot apply, and says so.
  TargetModelInstance automatic(registry_->find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"),
                                {{"path", model.string()}, {"dtype", "auto"}, {"feature_layers", 2}, {"kernels", "auto"}},
                                InstanceOptions{"cpu", "float32", 0});
  EXPECT_FALSE(automatic.describe().at("exact_decoding").get<bool>());
}

// Exact decoding: a block of tokens gets bitwise the logits and hidden states
// that the same tokens get one at a time — eagerly and through CUDA graphs,
// with GQA, biases and both row buckets — and stays within bf16 rounding of
// the usual kernels (cuBLAS, flash attention), which do not give equality.
TEST_F(HfDecoder, ExactDecodingGivesABlockTheNumbersItsTokensGetAlone) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TinySpec qwen3;  // q/k norm, 2 q heads per kv head
  qwen3.hidden = 64;
  qwen3.inter = 96;
  qwen3.head_dim = 16;
  TinySpec qwen2;  // biases, 3 q heads per kv head, head_dim 8
  qwen2.model_type = "qwen2";
  qwen2.bias = true;
  qwen2.hidden = 48;
  qwen2.inter = 64;
  qwen2.heads = 6;
  qwen2.kv_heads = 2;
  int index = 0;
  for (const TinySpec& t : {qwen3, qwen2}) {
    SCOPED_TRACE(t.model_type);
    const fs::path model = write_model(dir_ / ("exact" + std::to_string(index++)), t, make_weights(t));
    auto make = [&](const std::string& exact, const std::string& graphs) {
      return std::make_unique<TargetModelInstance>(
          registry_->find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"),
          nlohmann::json{{"path", model.string()}, {"dtype", "bfloat16"}, {"feature_layers", 2}, {"kernels", "auto"},
                         {"decode_graphs", graphs}, {"exact_decoding", exact}},
          InstanceOptions{"cuda:0", "bfloat16", 0});
    };
    auto graphed = make("on", "auto"), eager = make("on", "off"), usual = make("off", "auto");
    if (!graphed->describe().at("flash_decoding").get<bool>()) GTEST_SKIP() << "no flash decoding in this build";
    EXPECT_TRUE(graphed->describe().at("exact_decoding").get<bool>());
    EXPECT_FALSE(usual->describe().at("exact_decoding").get<bool>());
    torch::manual_seed(17);
    const std::vector<int64_t> layers = {1, 3};
    for (int round = 0; round < 3; ++round) {  // graphs are captured on a shape's second use
      const auto prompt = torch::randint(0, t.vocab, {37 + round}, torch::kLong);
      const auto block = torch::randint(0, t.vocab, {16}, torch::kLong);
      for (TargetModelInstance* target : {graphed.get(), eager.get()}) {
        // One token a step …
        const int64_t alone = target->decode_begin(128);
        target->decode_extend(alone, prompt, {}, true);
        std::vector<torch::Tensor> logits, hidden1, hidden3;
        for (int64_t i = 0; i < 16; ++i) {
          const auto out = target->decode_extend(alone, block.narrow(0, i, 1), layers, true);
          logits.push_back(get(out, "logits").reshape({1, -1}));
          hidden1.push_back(get(out, "hidden.1").reshape({1, -1}));
          hidden3.push_back(get(out, "hidden.3").reshape({1, -1}));
        }
        target->decode_end(alone);
        const auto one_by_one = torch::cat(logits), h1 = torch::cat(hidden1), h3 = torch::cat(hidden3);
        // … against blocks: all 16 at once, and 5 + 11 (rows 1–4 and 8–16 take different buckets).
        for (const std::vector<int64_t>& split : std::vector<std::vector<int64_t>>{{16}, {5, 11}}) {
          const int64_t session = target->decode_begin(128);
          target->decode_extend(session, prompt, {}, true);
          int64_t at = 0;
          for (int64_t n : split) {
            const auto out = target->decode_extend(session, block.narrow(0, at, n), layers, true);
            EXPECT_TRUE(torch::equal(get(out, "logits").reshape({n, -1}), one_by_one.narrow(0, at, n)))
                << "logits of tokens " << at << "+" << n << ", round " << round;
            EXPECT_TRUE(torch::equal(get(out, "hidden.1").reshape({n, -1}), h1.narrow(0, at, n)));
            EXPECT_TRUE(torch::equal(get(out, "hidden.3").reshape({n, -1}), h3.narrow(0, at, n)));
            at += n;
          }
          target->decode_end(session);
        }
        if (target == graphed.get() && round == 2) {
          // Against the usual kernels: the same numbers up to bf16 rounding.
          const int64_t session = usual->decode_begin(128);
          usual->decode_extend(session, prompt, {}, true);
          const auto out = usual->decode_extend(session, block, layers, true);
          const auto theirs = get(out, "logits").reshape({16, -1}).to(torch::kFloat);
          const double scale = theirs.abs().max().item<double>();
          EXPECT_LE((one_by_one.to(torch::kFloat) - theirs).abs().max().item<double>(), 3e-2 * scale);
          usual->decode_end(session);
        }
      }
    }
    const auto stats = graphed->describe().at("decode_graph_stats");
    EXPECT_EQ(stats.at("failed").get<int64_t>(), 0) << stats.dump();
    EXPECT_GE(stats.at("replayed").get<int64_t>(), 20) << stats.dump();
  }
}

// Exact decoding verifies a draft tree losslessly: every node gets bitwise
// the logits and hidden states its token gets when the node's path from the
// root is decoded one token at a time (a tree of 40 nodes: more than one
// 16-row tile of the linear kernel, branches at several depths), and an
// accepted path continues exactly as the chain would.
TEST_F(HfDecoder, ExactDecodingGivesATreeNodeTheNumbersItsPathGetsAlone) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TinySpec t;
  t.hidden = 64;
  t.inter = 96;
  t.head_dim = 16;
  const fs::path model = write_model(dir_ / "exact_tree", t, make_weights(t));
  TargetModelInstance target(registry_->find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"),
                             nlohmann::json{{"path", model.string()}, {"dtype", "bfloat16"}, {"feature_layers", 2},
                                            {"kernels", "auto"}, {"exact_decoding", "on"}},
                             InstanceOptions{"cuda:0", "bfloat16", 0});
  if (!target.describe().at("flash_decoding").get<bool>()) GTEST_SKIP() << "no flash decoding in this build";
  ASSERT_TRUE(target.can_verify_tree());
  torch::manual_seed(23);
  const auto prompt = torch::randint(0, t.vocab, {29}, torch::kLong);
  // 40 nodes (3 row tiles of the linear kernels) and 129 (a 128-node tree
  // and the newest token: 9 tiles, the most one block takes): node i's parent
  // is drawn from the nodes before it (the root's is -1).
  for (const int64_t n : {int64_t{40}, int64_t{129}}) {
    SCOPED_TRACE(std::to_string(n) + " nodes");
    const int64_t capacity = 192;
    std::vector<int64_t> parents = {-1};
    for (int64_t i = 1; i < n; ++i) parents.push_back(torch::randint(0, i, {1}, torch::kLong).item<int64_t>());
    const auto tokens = torch::randint(0, t.vocab, {n}, torch::kLong);
    const std::vector<int64_t> layers = {1, 3};
    std::vector<NamedTensors> alone_results;  // node i's path decoded one token at a time
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int64_t> path;
      for (int64_t a = i; a >= 0; a = parents[static_cast<size_t>(a)]) path.insert(path.begin(), a);
      const int64_t alone = target.decode_begin(capacity);
      target.decode_extend(alone, prompt, {}, false);
      NamedTensors last;
      for (int64_t node : path) last = target.decode_extend(alone, tokens.narrow(0, node, 1), layers, true);
      target.decode_end(alone);
      alone_results.push_back(last);
    }
    // Three times: eagerly, captured as a CUDA graph (a node count's second
    // use), replayed.
    for (int round = 0; round < 3; ++round) {
      const int64_t session = target.decode_begin(capacity);
      target.decode_extend(session, prompt, {}, false);
      const int64_t replays = target.describe().at("decode_graph_stats").at("replayed").get<int64_t>();
      const NamedTensors tree = target.decode_verify_tree(session, tokens, parents, layers, true);
      const int64_t replays_after = target.describe().at("decode_graph_stats").at("replayed").get<int64_t>();
      EXPECT_EQ(replays_after - replays, round == 0 ? 0 : 1)
          << "round " << round << ": the tree step graphed from its second use";
      target.decode_end(session);
      for (int64_t i = 0; i < n; ++i) {
        const NamedTensors& last = alone_results[static_cast<size_t>(i)];
        EXPECT_TRUE(torch::equal(get(tree, "logits").reshape({n, -1})[i], get(last, "logits").reshape({-1})))
            << "node " << i << ", round " << round;
        EXPECT_TRUE(torch::equal(get(tree, "hidden.3").reshape({n, -1})[i], get(last, "hidden.3").reshape({-1})))
            << "node " << i << ", round " << round;
      }
    }
    const auto graphs_after = target.describe().at("decode_graph_stats");
    EXPECT_EQ(graphs_after.at("failed").get<int64_t>(), 0) << graphs_after.dump();
    const int64_t session = target.decode_begin(capacity);
    target.decode_extend(session, prompt, {}, false);
    target.decode_verify_tree(session, tokens, parents, layers, true);
    // Accept the deepest node's path; the next token continues as the chain's.
    int64_t deepest = 0, depth_of_deepest = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t d = 0;
      for (int64_t a = i; a >= 0; a = parents[static_cast<size_t>(a)]) ++d;
      if (d > depth_of_deepest) deepest = i, depth_of_deepest = d;
    }
    std::vector<int64_t> path;
    for (int64_t a = deepest; a >= 0; a = parents[static_cast<size_t>(a)]) path.insert(path.begin(), a);
    target.decode_accept_path(session, path);
    const auto next = torch::randint(0, t.vocab, {1}, torch::kLong);
    const auto after_tree = target.decode_extend(session, next, {}, true);
    const int64_t chain = target.decode_begin(capacity);
    target.decode_extend(chain, prompt, {}, false);
    for (int64_t node : path) target.decode_extend(chain, tokens.narrow(0, node, 1), {}, false);
    const auto after_chain = target.decode_extend(chain, next, {}, true);
    EXPECT_TRUE(torch::equal(get(after_tree, "logits"), get(after_chain, "logits")));
    target.decode_end(chain);
    target.decode_end(session);
  }
}

TEST_F(HfDecoder, BadRequestsFailClearly) {
  TinySpec t;
  auto target = load(write_model(dir_, t, make_weights(t)));
  EXPECT_THROW(target->forward({{"input_ids", torch::full({1, 3}, t.vocab, torch::kLong)}}, {0}, false, false), PluginCallError);
  try {
    target->forward({{"input_ids", torch::zeros({1, 3}, torch::kLong)}}, {4}, false, false);
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "layer id 4 is outside [0, 4)");
  }
}

}  // namespace
