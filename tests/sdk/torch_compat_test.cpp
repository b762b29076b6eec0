// The compatibility header gives one fused-attention call on every LibTorch we
// build against; it must equal softmax(q·kᵀ/√d + mask)·v written out by hand.
#include <dflash/sdk/torch.hpp>
#include <dflash/sdk/torch_compat.hpp>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <cmath>

namespace {

torch::Tensor reference_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& mask) {
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (mask.defined()) scores = scores + mask;
  return torch::matmul(torch::softmax(scores, -1), v);
}

TEST(TorchCompat, ScaledDotProductAttentionMatchesTheDefinition) {
  torch::manual_seed(0);
  auto q = torch::randn({2, 3, 5, 8}, torch::kDouble);
  auto k = torch::randn({2, 3, 7, 8}, torch::kDouble);
  auto v = torch::randn({2, 3, 7, 4}, torch::kDouble);
  auto mask = torch::zeros({5, 7}, torch::kDouble);
  mask.slice(1, 4, 7).fill_(-std::numeric_limits<double>::infinity());  // the last keys are hidden
  auto fused = dflash::compat::scaled_dot_product_attention(q, k, v, mask, /*is_causal=*/false);
  EXPECT_TRUE(torch::allclose(fused, reference_attention(q, k, v, mask), 1e-10, 1e-10));
  auto causal_q = torch::randn({1, 2, 6, 8}, torch::kDouble);
  auto causal_k = torch::randn({1, 2, 6, 8}, torch::kDouble);
  auto causal_v = torch::randn({1, 2, 6, 8}, torch::kDouble);
  auto upper = torch::ones({6, 6}, torch::kBool).triu(1);
  auto causal_mask = torch::zeros({6, 6}, torch::kDouble).masked_fill(upper, -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(torch::allclose(dflash::compat::scaled_dot_product_attention(causal_q, causal_k, causal_v, c10::nullopt, true),
                              reference_attention(causal_q, causal_k, causal_v, causal_mask), 1e-10, 1e-10));
}

// Grouped-query attention: query head h reads key/value head h / group
// (consecutive query heads share one), with a mask and causal alike.
TEST(TorchCompat, GroupedQueryAttentionMatchesRepeatedHeads) {
  torch::manual_seed(1);
  auto q = torch::randn({2, 6, 5, 8}, torch::kDouble);
  auto k = torch::randn({2, 2, 5, 8}, torch::kDouble);
  auto v = torch::randn({2, 2, 5, 4}, torch::kDouble);
  auto upper = torch::ones({5, 5}, torch::kBool).triu(1);
  auto mask = torch::zeros({5, 5}, torch::kDouble).masked_fill(upper, -std::numeric_limits<double>::infinity());
  const auto expected = reference_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), mask);
  EXPECT_TRUE(torch::allclose(dflash::compat::grouped_query_attention(q, k, v, mask, false), expected, 1e-10, 1e-10));
  EXPECT_TRUE(torch::allclose(dflash::compat::grouped_query_attention(q, k, v, c10::nullopt, true), expected, 1e-10, 1e-10));
}

TEST(TorchCompat, VersionMacroAgreesWithTheHeader) {
  EXPECT_TRUE(DFLASH_TORCH_AT_LEAST(1, 13));
  EXPECT_FALSE(DFLASH_TORCH_AT_LEAST(TORCH_VERSION_MAJOR + 1, 0));
  EXPECT_TRUE(DFLASH_TORCH_AT_LEAST(TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR));
}

}  // namespace

// parse_device names a device with its index, as tensors report theirs: a
// plugin on "cuda" compares equal with the tensors it made there. Bad names
// are refused as configuration errors.
TEST(TorchCompat, ParseDeviceGivesTheIndexedDevice) {
  EXPECT_EQ(dflash::sdk::parse_device("cpu"), c10::Device(c10::kCPU));
  EXPECT_EQ(dflash::sdk::parse_device("cuda:1"), c10::Device(c10::kCUDA, 1));
  EXPECT_THROW(dflash::sdk::parse_device("gpu0"), dflash::sdk::Error);
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: \"cuda\" cannot be resolved here";
  const c10::Device device = dflash::sdk::parse_device("cuda");
  ASSERT_TRUE(device.has_index());
  EXPECT_EQ(torch::empty({1}, torch::TensorOptions().device(device)).device(), device);
  EXPECT_EQ(torch::empty({1}, torch::TensorOptions().device(c10::Device("cuda"))).device(), device);
}
