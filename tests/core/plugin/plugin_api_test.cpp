// Drives every vtable slot of every kind through the host, with real plugins
// built by the SDK (tests/fixtures/plugins/good). The central property: tensors cross
// as handles, so autograd survives drafter -> loss -> backward.
#include "plugin/host_api.h"
#include "log/log.h"
#include "plugin/instances.h"
#include "support/expect.h"
#include "plugin/registry.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

namespace {
using namespace dflash::host;

class PluginApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    registry_->add_directory(DFLASH_GOOD_PLUGIN_DIR);
  }
  const PluginRecord& find(dflash_kind kind, const std::string& name) { return registry_->find(kind, name); }
  static nlohmann::json defaults(const PluginRecord& record) {
    nlohmann::json out = nlohmann::json::object();
    for (auto& [key, property] : record.schema.at("properties").items()) out[key] = property.at("default");
    return out;
  }
  static PluginRegistry* registry_;
};
PluginRegistry* PluginApi::registry_ = nullptr;

at::Tensor get(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [key, tensor] : tensors)
    if (key == name) return tensor;
  ADD_FAILURE() << "missing " << name;
  return {};
}

TEST_F(PluginApi, LossGradientCrossesTheBoundary) {
  const auto& record = find(DFLASH_KIND_LOSS, "test_loss");
  LossInstance loss(record, {{"scale", 2.0}}, {});
  torch::manual_seed(0);
  auto hidden = torch::randn({6, 4}, torch::kDouble).requires_grad_(true);
  auto weight = torch::randn({9, 4}, torch::kDouble);
  auto targets = torch::tensor({1, 2, -100, 8, 0, 3}, torch::kLong);
  auto row_weights = torch::tensor({1.0, 0.5, 1.0, 0.25, 1.0, 2.0}, torch::kDouble);
  LossOutput out = loss.compute({hidden, weight, targets, -100, row_weights});
  out.loss.backward();

  // The same math done directly, in the test.
  auto h2 = hidden.detach().clone().requires_grad_(true);
  auto valid = targets.ne(-100);
  auto nll = -torch::log_softmax(torch::matmul(h2, weight.t()), -1)
                  .gather(1, torch::where(valid, targets, torch::zeros_like(targets)).unsqueeze(1))
                  .squeeze(1);
  auto w = valid.to(torch::kDouble) * row_weights;
  auto expected = 2.0 * (nll * w).sum() / w.sum();
  expected.backward();
  EXPECT_NEAR(out.loss.item<double>(), expected.item<double>(), 1e-12);
  ASSERT_TRUE(hidden.grad().defined());
  EXPECT_TRUE(torch::allclose(hidden.grad(), h2.grad(), 1e-12, 1e-12));
  EXPECT_EQ(hidden.grad()[2].abs().sum().item<double>(), 0.0) << "the ignored row gets no gradient";
  EXPECT_EQ(get(out.metrics, "accuracy").sizes(), (std::vector<int64_t>{6}));
  EXPECT_EQ(get(out.metrics, "rows").item<double>(), 6.0);
}

TEST_F(PluginApi, LossTrainableWeightAndTeacherHidden) {
  LossInstance loss(find(DFLASH_KIND_LOSS, "test_loss"), {{"scale", 1.0}}, {});
  torch::manual_seed(1);
  auto hidden = torch::randn({5, 3}).requires_grad_(true);
  auto weight = torch::randn({7, 3}).requires_grad_(true);
  LossCall call{hidden, weight, torch::tensor({0, 1, 2, 3, 4}, torch::kLong)};
  call.teacher = DFLASH_TEACHER_HIDDEN;
  call.teacher_hidden = torch::randn({5, 3});
  LossOutput with_teacher = loss.compute(call);
  with_teacher.loss.backward();
  EXPECT_TRUE(weight.grad().defined()) << "a trainable lm_head receives its gradient";
  call.teacher = DFLASH_TEACHER_NONE;
  EXPECT_GT(with_teacher.loss.item<double>(), loss.compute(call).loss.item<double>()) << "the KL term is added";
}

TEST_F(PluginApi, LossErrorsBecomePluginCallErrors) {
  LossInstance loss(find(DFLASH_KIND_LOSS, "test_loss"), {{"scale", 1.0}}, {});
  try {
    loss.compute({torch::randn({4, 3}), torch::randn({7, 5}), torch::zeros({4}, torch::kLong)});
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_EQ(e.code(), DFLASH_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("loss plugin 'test_loss'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("compute failed (invalid argument)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hidden must be [N, H]"), std::string::npos) << e.what();
  }
  // A LibTorch error inside the plugin is the plugin's bug: an internal
  // error, a short message with where LibTorch raised it, no backtrace; the
  // backtrace goes to the log at debug level.
  dflash::log::set_level("debug");
  testing::internal::CaptureStderr();
  try {
    loss.compute({torch::randn({4, 3}), torch::randn({7, 3}), torch::zeros({5}, torch::kLong)});
    ADD_FAILURE() << "accepted";
  } catch (const PluginCallError& e) {
    EXPECT_EQ(e.code(), DFLASH_ERR_INTERNAL);
    EXPECT_CONTAINS(e.what(), "compute failed (internal error)");
    EXPECT_CONTAINS(e.what(), "test_loss: LibTorch error: ");
    EXPECT_CONTAINS(e.what(), " [raised from ");
    EXPECT_CONTAINS(e.what(), "(--log-level debug logs its backtrace)");
    EXPECT_EQ(std::string(e.what()).find("frame #"), std::string::npos) << e.what();
  }
  const std::string logged = testing::internal::GetCapturedStderr();
  dflash::log::set_level("info");
  EXPECT_CONTAINS(logged, "exception: ");
  EXPECT_CONTAINS(logged, "Exception raised from ");
}

TEST_F(PluginApi, LossMemoryEstimateIsOptional) {
  LossInstance loss(find(DFLASH_KIND_LOSS, "test_loss"), {{"scale", 1.0}}, {});
  dflash_loss_shape shape{sizeof(dflash_loss_shape), 100, 16, 1000, 0, DFLASH_TEACHER_NONE, 2, 0};
  auto estimate = loss.estimate_memory(shape);
  ASSERT_TRUE(estimate.has_value());
  EXPECT_EQ(estimate->peak_bytes, 100u * 1000u * 2u * 3u);
  EXPECT_EQ(estimate->saved_for_backward_bytes, 100u * 1000u * 2u);
}

TEST_F(PluginApi, SchedulerLrAndState) {
  SchedulerInstance schedule(find(DFLASH_KIND_SCHEDULER, "test_schedule"), {{"factor", 0.5}}, {});
  EXPECT_DOUBLE_EQ(schedule.lr_at(0, 10, 1.0), 1.125);
  EXPECT_DOUBLE_EQ(schedule.lr_at(3, 10, 1.0), 0.125 + 0.125);
  ASSERT_TRUE(schedule.has_state());
  EXPECT_EQ(nlohmann::json::parse(schedule.save_state()), (nlohmann::json{{"offset", 0.125}}));
  schedule.load_state(R"({"offset": 1.0})");
  EXPECT_DOUBLE_EQ(schedule.lr_at(1, 10, 1.0), 1.5);
  EXPECT_THROW(schedule.lr_at(11, 10, 1.0), PluginCallError);
  EXPECT_THROW(schedule.load_state(R"({"wrong": 1})"), PluginCallError);
}

TEST_F(PluginApi, DataSourceBatchesAndResumableState) {
  const auto& record = find(DFLASH_KIND_DATA_SOURCE, "test_data");
  DataSourceInstance data(record, defaults(record), {});
  auto first = data.next_batch();
  ASSERT_TRUE(first);
  EXPECT_EQ(get(*first, "input_ids").sizes(), (std::vector<int64_t>{2, 5}));
  const std::string state = data.save_state();
  auto second = data.next_batch();
  ASSERT_TRUE(second);
  // Another instance restored to the saved position yields the same batch.
  DataSourceInstance resumed(record, defaults(record), {});
  resumed.load_state(state);
  auto again = resumed.next_batch();
  ASSERT_TRUE(again);
  EXPECT_TRUE(torch::equal(get(*second, "input_ids"), get(*again, "input_ids")));
  ASSERT_TRUE(data.next_batch());
  EXPECT_FALSE(data.next_batch()) << "end of data after 3 batches";
  EXPECT_EQ(data.describe()->at("vocab_size"), 11);
}

TEST_F(PluginApi, CDataSourceCrossesAsDlpackWithoutACopy) {
  DataSourceInstance data(find(DFLASH_KIND_DATA_SOURCE, "c_data"), nlohmann::json::object(), {});
  auto batch = data.next_batch();
  ASSERT_TRUE(batch);
  EXPECT_TRUE(torch::equal(get(*batch, "input_ids"), torch::arange(6, torch::kLong).view({2, 3})));
  EXPECT_TRUE(torch::equal(get(*batch, "loss_mask"), torch::ones({2, 3}, torch::kLong)));
  EXPECT_FALSE(data.describe().has_value()) << "describe is optional and absent";
  data.load_state(R"({"next": 1})");
  EXPECT_EQ(get(*data.next_batch(), "input_ids")[0][0].item<int64_t>(), 1000);
  EXPECT_FALSE(data.next_batch());
  try {
    data.load_state("garbage");
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_EQ(e.code(), DFLASH_ERR_DATA);
    EXPECT_NE(std::string(e.what()).find("c_data: state is not"), std::string::npos);
  }
}

TEST(Dlpack, RoundTripAndRefusals) {
  auto t = torch::arange(12, torch::kFloat).view({3, 4}).t();  // non-contiguous strides survive
  dflash_dl_managed_tensor* exported = tensor_to_dlpack(t);
  EXPECT_EQ(exported->dl_tensor.ndim, 2);
  at::Tensor back = tensor_from_dlpack(exported);  // takes ownership, calls the deleter later
  EXPECT_TRUE(torch::equal(back, t));
  EXPECT_EQ(back.data_ptr(), t.data_ptr()) << "no copy";
  EXPECT_THROW(tensor_to_dlpack(torch::ones({2}).requires_grad_(true)), std::invalid_argument);
  // A bad DLPack struct is refused and its deleter still runs exactly once.
  static int deleted = 0;
  deleted = 0;
  dflash_dl_managed_tensor bad{};
  bad.version.major = 7;
  bad.deleter = [](dflash_dl_managed_tensor*) { ++deleted; };
  EXPECT_THROW(tensor_from_dlpack(&bad), std::invalid_argument);
  EXPECT_EQ(deleted, 1);
}

// On the GPU machine: CUDA tensors cross as handles (autograd intact) and as
// DLPack (device preserved, no copy). Skipped where no GPU is present.
TEST_F(PluginApi, CudaTensorsCrossTheBoundary) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  LossInstance loss(find(DFLASH_KIND_LOSS, "test_loss"), {{"scale", 1.0}}, {"cuda:0", "float32", 0});
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  auto hidden = torch::randn({64, 32}, cuda).requires_grad_(true);
  auto weight = torch::randn({100, 32}, cuda);
  auto targets = torch::randint(0, 100, {64}, cuda.dtype(torch::kLong));
  LossOutput out = loss.compute({hidden, weight, targets});
  EXPECT_TRUE(out.loss.is_cuda());
  out.loss.backward();
  ASSERT_TRUE(hidden.grad().defined());
  EXPECT_TRUE(hidden.grad().is_cuda());
  auto h2 = hidden.detach().clone().requires_grad_(true);
  torch::nll_loss(torch::log_softmax(torch::matmul(h2, weight.t()), -1), targets).backward();
  EXPECT_TRUE(torch::allclose(hidden.grad(), h2.grad(), 1e-5, 1e-6));

  auto t = torch::arange(10, cuda.dtype(torch::kFloat));
  at::Tensor back = tensor_from_dlpack(tensor_to_dlpack(t));
  EXPECT_TRUE(back.is_cuda());
  EXPECT_EQ(back.data_ptr(), t.data_ptr());
}

TEST_F(PluginApi, TargetDrafterLossChainTrainsTheDrafter) {
  const auto& target_record = find(DFLASH_KIND_TARGET_MODEL, "test_target");
  const auto& drafter_record = find(DFLASH_KIND_DRAFTER, "test_drafter");
  const auto& data_record = find(DFLASH_KIND_DATA_SOURCE, "test_data");
  TargetModelInstance target(target_record, defaults(target_record), {"cpu", "float32", 7});
  DrafterInstance drafter(drafter_record, defaults(drafter_record), {"cpu", "float32", 7});
  DataSourceInstance data(data_record, defaults(data_record), {});
  LossInstance loss(find(DFLASH_KIND_LOSS, "test_loss"), {{"scale", 1.0}}, {});

  const nlohmann::json info = target.describe();
  EXPECT_EQ(info.at("num_layers"), 4);
  NamedTensors frozen = target.frozen_weights();
  EXPECT_FALSE(get(frozen, "lm_head").requires_grad());
  drafter.bind_target(info, frozen);
  EXPECT_EQ(drafter.export_config()->at("layer_ids"), (nlohmann::json{1, 3}));
  drafter.set_training(true);

  NamedTensors batch = *data.next_batch();
  NamedTensors features = target.forward(batch, {1, 3}, true, true);
  EXPECT_EQ(get(features, "hidden.1").sizes(), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_EQ(get(features, "logits").sizes(), (std::vector<int64_t>{2, 5, 11}));
  EXPECT_FALSE(get(features, "hidden.3").requires_grad()) << "the target keeps no graph";
  EXPECT_THROW(target.forward(batch, {9}, false, false), PluginCallError);

  NamedTensors inputs = batch;
  for (auto& entry : features) inputs.push_back(entry);
  NamedTensors drafted = drafter.forward(inputs);
  LossOutput out = loss.compute({get(drafted, "hidden"), get(frozen, "lm_head"), get(drafted, "targets"), -100,
                                 get(drafted, "row_weights")});
  out.loss.backward();

  // The host sees the drafter's live parameter: its grad arrived through
  // drafter plugin -> loss plugin -> backward, and an in-place update by the
  // host's optimizer changes what the drafter computes.
  at::Tensor weight = get(drafter.parameters(), "proj.weight");
  ASSERT_TRUE(weight.grad().defined());
  EXPECT_GT(weight.grad().abs().sum().item<double>(), 0.0);
  auto direct = torch::matmul(torch::cat({get(features, "hidden.1"), get(features, "hidden.3")}, -1).flatten(0, 1),
                              weight.detach());
  EXPECT_TRUE(torch::allclose(get(drafted, "hidden").detach(), direct));
  const double before = out.loss.item<double>();
  {
    torch::NoGradGuard no_grad;
    weight.sub_(weight.grad() * 0.5);
  }
  NamedTensors drafted_again = drafter.forward(inputs);
  const double after = loss.compute({get(drafted_again, "hidden"), get(frozen, "lm_head"), get(drafted_again, "targets"),
                                     -100, get(drafted_again, "row_weights")}).loss.item<double>();
  EXPECT_LT(after, before) << "one gradient step through the ABI lowers the loss";
}

}  // namespace
