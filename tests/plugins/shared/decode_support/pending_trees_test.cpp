// The tree arguments of the row-invariant decoding attention
// (decode_support::tree_path_rows), as the hf_decoder target passes them.
#include <pending_trees.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ds = dflash::decode_support;

namespace {

// Node i's path from the root by walking `parents`, as session rows.
std::vector<int32_t> path_of(const std::vector<int64_t>& parents, int64_t i, int64_t first_row) {
  std::vector<int32_t> path;
  for (int64_t a = i; a >= 0; a = parents[static_cast<size_t>(a)]) path.insert(path.begin(), static_cast<int32_t>(first_row + a));
  return path;
}

TEST(TreePathRows, EachRowIsItsNodesPathFromTheRootItselfLastPaddedToTheStride) {
  // 0 ─ 1 ─ 2 ─ 4, 0 ─ 3, and a second root 5 ─ 6: depths 1 2 3 2 4 1 2.
  const std::vector<int64_t> parents = {-1, 0, 1, 0, 2, -1, 5};
  const int64_t first_row = 40;
  const ds::TreePathRows p = ds::tree_path_rows(parents, ds::tree_depths(parents), first_row);
  const size_t stride = static_cast<size_t>(ds::kMinTreePathStride);
  EXPECT_EQ(p.stride, ds::kMinTreePathStride);  // the deepest path, 4, is within it
  ASSERT_EQ(p.rows.size(), parents.size() * stride);
  ASSERT_EQ(p.lengths.size(), parents.size());
  for (size_t i = 0; i < parents.size(); ++i) {
    const std::vector<int32_t> want = path_of(parents, static_cast<int64_t>(i), first_row);
    ASSERT_EQ(p.lengths[i], static_cast<int32_t>(want.size())) << "node " << i;
    for (size_t d = 0; d < stride; ++d)
      EXPECT_EQ(p.rows[i * stride + d], d < want.size() ? want[d] : 0) << "node " << i << ", place " << d;
  }
}

// One stride for every tree as deep as a DFlash block (so one graph a node
// count), doubled past it.
TEST(TreePathRows, TheStrideIsSixteenUnlessAPathIsLongerThenDoubled) {
  for (const auto& [nodes, stride] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 16}, {2, 16}, {9, 16}, {16, 16}, {17, 32}, {33, 64}}) {
    std::vector<int64_t> chain(static_cast<size_t>(nodes));
    for (int64_t i = 0; i < nodes; ++i) chain[static_cast<size_t>(i)] = i - 1;
    EXPECT_EQ(ds::tree_path_rows(chain, ds::tree_depths(chain), 0).stride, stride) << nodes << " nodes in a chain";
  }
}

}  // namespace
