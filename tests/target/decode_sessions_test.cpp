// The KV pool shared by the Hugging Face targets (plugins/shared/hf_support/
// decode_sessions.h): growth deferred to the first look at the pool, so a
// batch admitted one begin() at a time moves the pool once.
#include <decode_sessions.h>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

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

}  // namespace
