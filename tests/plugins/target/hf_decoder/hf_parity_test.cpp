// target/hf_decoder against Hugging Face transformers itself: tiny Qwen3 and
// Llama checkpoints made by transformers, with its outputs, committed under
// tests/fixtures/hf_tiny (scripts/make_target_fixture.py made them on the GPU
// machine). fp32 on the CPU must agree to 1e-4 of the activation scale; on a
// GPU, bf16 must agree within bf16 tolerance.
#include "plugin/instances.h"
#include "plugin/registry.h"

#include <dflash/sdk/safetensors_torch.hpp>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <filesystem>

namespace fs = std::filesystem;
using namespace dflash::host;
namespace st = dflash::sdk::safetensors;

namespace {

torch::Tensor get(const NamedTensors& t, const std::string& name) {
  for (const auto& [n, tensor] : t)
    if (n == name) return tensor;
  ADD_FAILURE() << "missing " << name;
  return {};
}

void check_parity(const std::string& model, const std::string& device, const std::string& dtype, double tolerance,
                  const std::string& suffix) {
  SCOPED_TRACE(model + " " + device + " " + dtype);
  const fs::path dir = fs::path(DFLASH_HF_FIXTURES) / model;
  ASSERT_TRUE(fs::exists(dir / "reference.safetensors")) << "missing fixture " << dir;
  auto reference = st::File::open(dir / "reference.safetensors");
  if (!reference->find("last_hidden" + suffix)) GTEST_SKIP() << "the fixture has no " << suffix << " reference";
  PluginRegistry registry;
  registry.add_directory(DFLASH_INTREE_PLUGIN_DIR);
  TargetModelInstance target(registry.find(DFLASH_KIND_TARGET_MODEL, "hf_decoder"),
                             {{"path", dir.string()}, {"dtype", dtype}, {"feature_layers", 3}}, {device, dtype, 0});
  const int64_t layers = target.describe().at("num_layers").get<int64_t>();
  std::vector<int64_t> ids;
  for (int64_t i = 0; i + 1 < layers; ++i) ids.push_back(i);
  const auto input_ids = st::load_tensor(reference, "input_ids").to(device);
  NamedTensors out = target.forward({{"input_ids", input_ids}}, ids, true, true);
  auto compare = [&](const std::string& name) {
    const auto expected = st::load_tensor(reference, name + suffix).to(torch::kDouble);
    const auto got = get(out, name).to(torch::kCPU, torch::kDouble);
    const double scale = expected.abs().max().item<double>();
    const double error = (got - expected).abs().max().item<double>();
    EXPECT_LE(error, tolerance * scale) << name << ": max abs error " << error << " at scale " << scale;
  };
  for (int64_t i : ids) compare("hidden." + std::to_string(i));
  compare("last_hidden");
  compare("logits");
}

TEST(HfParity, Qwen3Fp32OnTheCpu) { check_parity("qwen3", "cpu", "float32", 1e-4, ""); }
TEST(HfParity, LlamaTiedWithLlama3ScalingFp32OnTheCpu) { check_parity("llama", "cpu", "float32", 1e-4, ""); }

TEST(HfParity, Bf16OnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_parity("qwen3", "cuda:0", "bfloat16", 3e-2, ".bf16");
  check_parity("llama", "cuda:0", "bfloat16", 3e-2, ".bf16");
}

}  // namespace
