// The KV pool shared by the Hugging Face targets (plugins/shared/hf_support/
// decode_sessions.h): growth deferred to the first look at the pool, so a
// batch admitted one begin() at a time moves the pool once.
#include <decode_sessions.h>
#include <kernel_ops.h>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <stdexcept>

namespace {

using dflash::hf::DecodeSessions;

DecodeSessions small_pool() { return DecodeSessions(2, 2, 4, at::TensorOptions().dtype(at::kFloat)); }

TEST(DecodeSessions, ABatchOfBeginsGrowsThePoolOnce) {
  DecodeSessions pool = small_pool();
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(pool.begin(8));
  EXPECT_EQ(pool.generation(), 1u) << "five begins, one move";
  EXPECT_EQ(pool.rows(), 5);
  EXPECT_EQ(pool.row_capacity(), 8);
  for (int64_t layer : {0, 1}) {
    EXPECT_EQ(pool.keys(layer).sizes(), (std::vector<int64_t>{5, 8, 2, 4}));
    EXPECT_EQ(pool.values(layer).abs().sum().item<float>(), 0.f) << "zero-filled";
  }
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(pool.at(ids[i]).row, static_cast<int64_t>(i));
}

TEST(DecodeSessions, GrowingKeepsEveryCachedPrefix) {
  DecodeSessions pool = small_pool();
  const int64_t a = pool.begin(8), b = pool.begin(8);
  const at::Tensor cached = at::randn({2, 3, 2, 4});
  pool.keys(1).narrow(1, 0, 3).copy_(cached);
  pool.at(a).length = 3;
  pool.at(b).length = 3;
  const uint64_t before = pool.generation();
  const int64_t c = pool.begin(8), d = pool.begin(16);  // more rows and a longer row: one move
  EXPECT_EQ(pool.generation(), before + 1);
  EXPECT_EQ(pool.rows(), 4);
  EXPECT_EQ(pool.row_capacity(), 16);
  EXPECT_TRUE(pool.keys(1).narrow(0, 0, 2).narrow(1, 0, 3).equal(cached));
  EXPECT_EQ(pool.keys(1).narrow(0, 2, 2).abs().sum().item<float>(), 0.f);
  // A freed row is taken again without growing.
  pool.end(c);
  const uint64_t settled = pool.generation();
  const int64_t e = pool.begin(8);
  EXPECT_EQ(pool.at(e).row, 2);
  EXPECT_EQ(pool.generation(), settled);
  // The last session's end gives the memory back (the pool is not kept).
  for (int64_t id : {a, b, d, e}) pool.end(id);
  EXPECT_EQ(pool.rows(), 0);
  EXPECT_EQ(pool.row_capacity(), 0);
}

TEST(DecodeSessions, SessionsEndedBeforeTheFirstLookLeaveNoRows) {
  DecodeSessions pool = small_pool();
  const int64_t a = pool.begin(8), b = pool.begin(8);
  pool.end(a);
  pool.end(b);  // never looked at: nothing was allocated, nothing is left
  EXPECT_EQ(pool.rows(), 0);
  const int64_t c = pool.begin(4);
  EXPECT_EQ(pool.at(c).row, 0);
  EXPECT_EQ(pool.keys(0).sizes(), (std::vector<int64_t>{1, 4, 2, 4}));
}

// A draft tree's accepted path kept in every layer's cache with one launch
// (kernel_ops::move_cache_rows_, what hf_decoder's accept_path runs on a
// GPU): the same rows as the gather-then-scatter it replaces, in every
// cache, for rows whose bytes take 16-, 4- and 1-byte words, with more caches
// and moves than one launch holds; sources that could be overwritten before
// they are read are refused by name.
TEST(DecodeSessions, CacheRowMovesKeepAPathInEveryCacheAsAGatherDoes) {
  if (!dflash::kernel_ops::available() || !at::hasCUDA()) GTEST_SKIP() << "no CUDA kernels or no CUDA device";
  at::manual_seed(3);
  struct Case {
    at::ScalarType dtype;
    int64_t row_numel, caches, rows, to_start;
    std::vector<int64_t> from;
  };
  std::vector<int64_t> long_path;  // more moves than one launch holds
  for (int64_t j = 0; j < 300; ++j) long_path.push_back(10 + j + j / 7);
  const std::vector<Case> cases = {
      {at::kBFloat16, 2 * 128, 2 * 12, 64, 20, {20, 23, 24, 31}},  // 16-byte words
      {at::kHalf, 6, 3, 40, 5, {5, 6, 9, 17, 30}},                 // 4-byte words
      {at::kByte, 3, 2, 30, 0, {0, 2, 3, 29}},                     // single bytes
      {at::kFloat, 8, 130, 16, 2, {2, 3, 7}},                      // more caches than one launch holds
      {at::kBFloat16, 8, 3, 400, 10, long_path},
  };
  for (const Case& c : cases) {
    std::vector<at::Tensor> caches, expected;
    for (int64_t i = 0; i < c.caches; ++i) {
      const at::Tensor cache = at::randint(0, 200, {c.rows, c.row_numel}, at::TensorOptions().device(at::kCUDA)).to(c.dtype);
      at::Tensor want = cache.clone();
      const at::Tensor from = at::tensor(c.from, at::kLong).to(at::kCUDA);
      const at::Tensor to = at::arange(c.to_start, c.to_start + static_cast<int64_t>(c.from.size()), from.options());
      want.index_copy_(0, to, want.index_select(0, from));
      caches.push_back(cache);
      expected.push_back(want);
    }
    dflash::kernel_ops::move_cache_rows_(caches, c.row_numel, c.from, c.to_start);
    for (int64_t i = 0; i < c.caches; ++i)
      ASSERT_TRUE(at::equal(caches[static_cast<size_t>(i)], expected[static_cast<size_t>(i)]))
          << "cache " << i << " of " << c.caches << ", " << c.from.size() << " moves of " << c.row_numel << " "
          << at::toString(c.dtype);
  }
  const std::vector<at::Tensor> one = {at::zeros({8, 4}, at::TensorOptions().device(at::kCUDA))};
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{3, 2}, {1, 4}, {2, 9}}) {
    try {
      dflash::kernel_ops::move_cache_rows_(one, 4, bad, 2);
      ADD_FAILURE() << "moves from " << bad[0] << ", " << bad[1] << " to rows 2, 3 were accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("sources must increase"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
