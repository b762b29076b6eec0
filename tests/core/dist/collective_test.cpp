// The c10d collectives and the gradient reducer, with two ranks as two
// threads of this process (each its own Gloo process group on one TCPStore),
// and NCCL at world size one on a GPU.
#include "dist/gradient_reducer.h"
#include "dist/process_group.h"
#include "support/expect.h"
#include "support/free_port.h"
#include "train/sharded_adamw.h"

#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <functional>
#include <thread>

namespace dflash {
namespace {

// body(rank's collective) on `world` threads; the first failure is rethrown.
void on_ranks(int world, const std::string& device, const std::function<void(dist::Collective&)>& body) {
  const int port = test::free_loopback_port();
  const auto secret = dist::rendezvous::RunSecret::generate();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        dist::LaunchEnvironment env;
        env.rank = r;
        env.world_size = env.local_world_size = world;
        env.local_rank = r;
        env.master_addr = "127.0.0.1";
        env.master_port = port;
        env.secret = secret;
        auto group = dist::join(env, device, 60);
        body(*group);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

#if DFLASH_TEST_HAVE_GLOO
constexpr bool kHaveGloo = true;
#else
constexpr bool kHaveGloo = false;
#endif
// Several ranks on the CPU need Gloo (Debian's LibTorch has its headers; the
// GPU machine's torch wheel does not).
#define SKIP_WITHOUT_GLOO() \
  if (!kHaveGloo) GTEST_SKIP() << "this build has no Gloo"

TEST(Collectives, TwoRanksSumGatherBroadcastAndExchangeText) {
  SKIP_WITHOUT_GLOO();
  on_ranks(2, "cpu", [](dist::Collective& g) {
    const int r = g.rank();
    at::Tensor x = torch::full({3}, static_cast<float>(r + 1));
    g.all_reduce_sum(x, "test sum");
    EXPECT_TRUE(x.equal(torch::full({3}, 3.0f)));
    std::vector<at::Tensor> all;
    g.all_gather(all, torch::tensor({static_cast<int64_t>(10 * r)}), "test gather");
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[1].item<int64_t>(), 10);
    at::Tensor b = torch::full({2}, static_cast<double>(r), torch::kDouble);
    g.broadcast(b, 1, "test broadcast");
    EXPECT_TRUE(b.equal(torch::ones({2}, torch::kDouble)));
    const auto texts = g.all_gather_text(r == 0 ? "short" : std::string(1000, 'x'), "test text");
    EXPECT_EQ(texts.at(0), "short");
    EXPECT_EQ(texts.at(1), std::string(1000, 'x'));
    g.barrier("test barrier");
  });
}

// Each rank's last micro-batch reduces through the hooks; parameters reach
// the sum over ranks of their accumulated gradients; one no rank touched
// stays without a gradient; one only rank 1 touched gets rank 1's.
// Values without the global generator, which the rank threads share.
at::Tensor fixed(at::IntArrayRef shape, double frequency, const torch::TensorOptions& options = {}) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return torch::sin(torch::arange(n, torch::kDouble) * frequency).reshape(shape).to(options.dtype(torch::kFloat));
}

void reducer_case(dist::Collective& g, const torch::Device& device) {
  const auto options = torch::TensorOptions().device(device);
  at::Tensor a = (fixed({64, 32}, 0.37, options) * 0.1).requires_grad_(true);
  at::Tensor b = fixed({32}, 1.3, options).requires_grad_(true);
  at::Tensor unused = fixed({8}, 0.5, options).requires_grad_(true);
  at::Tensor only_rank1 = fixed({5}, 0.9, options).requires_grad_(true);
  const host::NamedTensors parameters = {{"a", a}, {"b", b}, {"unused", unused}, {"only_rank1", only_rank1}};
  // Small buckets: several of them, started in order during the backward.
  dist::GradientReducer reducer(parameters, g, at::kFloat, /*bucket_bytes=*/512);
  EXPECT_GE(reducer.bucket_count(), 2u);
  auto loss_of = [&](int rank, int micro) {
    const at::Tensor input = fixed({4, 64}, 0.01 * (1 + rank + 10 * micro), options);
    at::Tensor loss = ((input.matmul(a) + b).tanh()).sum();
    if (rank == 1) loss = loss + only_rank1.pow(2).sum();
    return loss;
  };
  at::Tensor expected_a = torch::zeros_like(a), expected_b = torch::zeros_like(b), expected_only = torch::zeros_like(only_rank1);
  for (int rank = 0; rank < g.world_size(); ++rank)
    for (int micro = 0; micro < 2; ++micro) {
      const auto grads = torch::autograd::grad({loss_of(rank, micro)}, {a, b, only_rank1}, {}, false, false, true);
      expected_a += grads[0];
      expected_b += grads[1];
      if (grads[2].defined()) expected_only += grads[2];
    }
  for (int step = 0; step < 2; ++step) {
    for (auto& [name, p] : parameters) p.mutable_grad() = at::Tensor();
    loss_of(g.rank(), 0).backward();
    reducer.arm(step);
    loss_of(g.rank(), 1).backward();
    reducer.finish();
    EXPECT_TRUE(torch::allclose(a.grad(), expected_a, 1e-5, 1e-6)) << "step " << step;
    EXPECT_TRUE(torch::allclose(b.grad(), expected_b, 1e-5, 1e-6));
    // Rank 1's gradient reaches every rank (with one rank there is none).
    ASSERT_EQ(only_rank1.grad().defined(), g.world_size() > 1);
    if (g.world_size() > 1) EXPECT_TRUE(torch::allclose(only_rank1.grad(), expected_only, 1e-5, 1e-6));
    EXPECT_FALSE(unused.grad().defined()) << "no rank has one: AdamW must leave it alone";
  }
}

TEST(GradientReducer, BucketsSumTheRanksGradientsAsTheBackwardRuns) {
  SKIP_WITHOUT_GLOO();
  on_ranks(2, "cpu", [](dist::Collective& g) { reducer_case(g, torch::kCPU); });
}

// ZeRO-1 on two ranks against AdamW on one: the same update.
TEST(ShardedOptimizer, TwoRanksUpdateAsOneAdamWDoes) {
  SKIP_WITHOUT_GLOO();
  auto make = [] {
    host::NamedTensors p = {{"w", fixed({40, 30}, 0.11).requires_grad_(true)},
                            {"v", fixed({30}, 0.7).requires_grad_(true)},
                            {"u", fixed({7, 3}, 1.9).requires_grad_(true)}};
    double f = 0.3;
    for (auto& [n, t] : p) t.mutable_grad() = fixed(t.sizes(), f += 0.2);
    return p;
  };
  train::AdamWOptions o;
  o.weight_decay = 0.1;
  o.fp32_master = true;
  host::NamedTensors reference = make();
  train::AdamW single(reference, o);
  single.step(1e-2);
  single.step(1e-2);
  const host::NamedTensors reference_state = single.state();
  on_ranks(2, "cpu", [&](dist::Collective& g) {
    host::NamedTensors mine = make();
    train::ShardedAdamW sharded(mine, o, g);
    sharded.step(1e-2);
    sharded.step(1e-2);
    for (size_t i = 0; i < mine.size(); ++i)
      EXPECT_TRUE(mine[i].second.equal(reference[i].second)) << mine[i].first << " on rank " << g.rank();
    // The gathered state is the whole state, as one AdamW writes it.
    const host::NamedTensors whole = sharded.state();
    ASSERT_EQ(whole.size(), reference_state.size());
    std::map<std::string, at::Tensor> by_name(whole.begin(), whole.end());
    for (const auto& [name, t] : reference_state) EXPECT_TRUE(by_name.at(name).equal(t)) << name;
    EXPECT_LT(sharded.local_state().size(), whole.size()) << "each rank holds only its share";
  });
}

TEST(Collectives, NcclAtWorldSizeOneRunsEveryCollectiveAndTheReducer) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  on_ranks(1, "cuda:0", [](dist::Collective& g) {
    at::Tensor x = torch::full({3}, 2.0f, torch::kCUDA);
    g.all_reduce_sum(x, "sum");
    EXPECT_TRUE(x.cpu().equal(torch::full({3}, 2.0f)));
    at::Tensor on_cpu = torch::full({2}, 5.0, torch::kDouble);  // staged through the GPU
    g.all_reduce_sum(on_cpu, "sum of a CPU tensor");
    EXPECT_TRUE(on_cpu.equal(torch::full({2}, 5.0, torch::kDouble)));
    EXPECT_EQ(g.all_gather_text("nccl", "text").at(0), "nccl");
    g.barrier("barrier");
    reducer_case(g, torch::kCUDA);
  });
}

}  // namespace
}  // namespace dflash
