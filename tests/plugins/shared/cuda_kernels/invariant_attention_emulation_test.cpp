// invariant_decode_attention's own source (cuda_kernels.cu, rewritten for the
// CPU by emulate_kernel_source.py, run by tests/support/cuda_emulation/) on
// every machine: a draft tree's node gets bitwise what the same query gets
// decoded alone after its path (the keys and values of the path copied after
// the prefix), a chain's query what it gets alone after the tokens before it,
// and both are within bf16 rounding of an exact softmax attention. The
// device runs the same checks through the targets (HfDecoder.ExactDecoding*).
#include "cuda_kernels_emulated.cpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

namespace ck = dflash::cuda_kernels;
using Bf16 = __nv_bfloat16;

struct Shape {
  int heads, kv_heads, head_dim;
};

std::vector<Bf16> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<Bf16> v(n);
  for (Bf16& e : v) e = __float2bfloat16(normal(rng));
  return v;
}

// One session whose rows [0, keys) hold the keys and values attended to;
// queries q [tokens, heads, head_dim]; a chain of n = tokens queries, or a
// tree (rows/lengths/stride) of its nodes.
std::vector<Bf16> attend(const Shape& s, const std::vector<Bf16>& q, const std::vector<Bf16>& k,
                         const std::vector<Bf16>& v, int keys, int tokens, const ck::DecodeTree& tree, int capacity,
                         const ck::AttentionTiling& tiling = {}) {
  std::vector<Bf16> out(static_cast<size_t>(tokens) * s.heads * s.head_dim);
  const int32_t cu_k[2] = {0, capacity}, seqused[1] = {keys};
  ck::invariant_decode_attention(ck::Element::kBFloat16, q.data(), k.data(), v.data(), cu_k, seqused, tree, out.data(),
                                 tokens, tokens, s.heads, s.kv_heads, s.head_dim, capacity, nullptr, tiling);
  return out;
}

int differing_bits(const std::vector<Bf16>& a, const std::vector<Bf16>& b) {
  int differing = 0;
  for (size_t e = 0; e < a.size(); ++e) differing += a[e].bits != b[e].bits;
  return differing;
}

// Exact attention of query (token, head) over the given session rows.
double worst_error(const Shape& s, const std::vector<Bf16>& q, int token, const std::vector<Bf16>& k,
                   const std::vector<Bf16>& v, const std::vector<int>& rows, const std::vector<Bf16>& out) {
  double worst = 0;
  const int stride = s.kv_heads * s.head_dim;
  for (int h = 0; h < s.heads; ++h) {
    const int kv = h / (s.heads / s.kv_heads);
    std::vector<double> score;
    double top = -INFINITY;
    for (int r : rows) {
      double dot = 0;
      for (int d = 0; d < s.head_dim; ++d)
        dot += static_cast<double>(__bfloat162float(q[(static_cast<size_t>(token) * s.heads + h) * s.head_dim + d])) *
               __bfloat162float(k[static_cast<size_t>(r) * stride + kv * s.head_dim + d]);
      score.push_back(dot / std::sqrt(static_cast<double>(s.head_dim)));
      top = std::max(top, score.back());
    }
    double total = 0;
    for (double& x : score) total += (x = std::exp(x - top));
    for (int d = 0; d < s.head_dim; ++d) {
      double want = 0;
      for (size_t i = 0; i < rows.size(); ++i)
        want += score[i] / total * __bfloat162float(v[static_cast<size_t>(rows[i]) * stride + kv * s.head_dim + d]);
      const double got = __bfloat162float(out[(static_cast<size_t>(token) * s.heads + h) * s.head_dim + d]);
      worst = std::max(worst, std::abs(got - want) / (std::abs(want) + 0.05));
    }
  }
  return worst;
}

// Rows `from` (session rows) of `source` copied to rows first, first + 1, … of `pool`.
template <class T>
void move_rows(T* pool, const T* source, const std::vector<int>& from, int first, int row_size) {
  for (size_t j = 0; j < from.size(); ++j)
    std::copy(source + static_cast<size_t>(from[j]) * row_size, source + static_cast<size_t>(from[j] + 1) * row_size,
              pool + static_cast<size_t>(first + static_cast<int>(j)) * row_size);
}

// The rows of `from` copied to rows first, first + 1, … of a copy of the pool.
std::vector<Bf16> with_rows_moved(const std::vector<Bf16>& source, const std::vector<int>& from, int first, int row_size) {
  std::vector<Bf16> pool = source;
  move_rows(pool.data(), source.data(), from, first, row_size);
  return pool;
}

// A draft tree of parent.size() nodes after `prefix` session rows, parents
// first (node 0 the root): each node's path (session rows, root first, the
// node last), and the kernel's view of them: rows [nodes, depth] (depth the
// longest path, or `stride` when that is more) and each path's length.
struct TestTree {
  std::vector<std::vector<int>> path;
  std::vector<int32_t> rows, lengths;
  int depth = 0;
  ck::DecodeTree view() const { return ck::DecodeTree{rows.data(), lengths.data(), depth}; }
};

TestTree test_tree(const std::vector<int>& parent, int prefix, int stride = 0) {
  const int nodes = static_cast<int>(parent.size());
  TestTree t;
  t.depth = stride;
  t.path.resize(nodes);
  for (int i = 0; i < nodes; ++i) {
    if (parent[i] >= 0) t.path[i] = t.path[parent[i]];
    t.path[i].push_back(prefix + i);
    t.depth = std::max(t.depth, static_cast<int>(t.path[i].size()));
  }
  t.rows.assign(static_cast<size_t>(nodes) * t.depth, 0);
  for (int i = 0; i < nodes; ++i) {
    t.lengths.push_back(static_cast<int32_t>(t.path[i].size()));
    std::copy(t.path[i].begin(), t.path[i].end(), t.rows.begin() + static_cast<size_t>(i) * t.depth);
  }
  return t;
}

TEST(InvariantAttentionEmulated, ATreeNodeGetsTheBitsOfItsPathDecodedAloneAndAChainQueryOfItsPrefix) {
  std::mt19937 rng(7);
  // 2 and 4 query heads per KV head at head_dim 16 (2 chunks, 128 slices;
  // a block takes 2 and 4 heads); 1 at 64.
  for (const Shape s : {Shape{4, 2, 16}, Shape{8, 2, 16}, Shape{2, 2, 64}}) {
    SCOPED_TRACE("heads " + std::to_string(s.heads) + ", kv heads " + std::to_string(s.kv_heads) + ", head_dim " +
                 std::to_string(s.head_dim));
    const int prefix = 37, capacity = 96, row_size = s.kv_heads * s.head_dim;
    const TestTree tree = test_tree({-1, 0, 0, 1, 1, 2, 3, 3, 6}, prefix);  // 9 nodes, paths up to 5 long
    const int nodes = static_cast<int>(tree.path.size());
    const std::vector<std::vector<int>>& path = tree.path;
    const std::vector<Bf16> k = random_bf16(static_cast<size_t>(capacity) * row_size, rng);
    const std::vector<Bf16> v = random_bf16(static_cast<size_t>(capacity) * row_size, rng);
    const std::vector<Bf16> q = random_bf16(static_cast<size_t>(nodes) * s.heads * s.head_dim, rng);
    const std::vector<Bf16> tree_out =
        attend(s, q, k, v, prefix + nodes, nodes, tree.view(), capacity);
    const size_t per_token = static_cast<size_t>(s.heads) * s.head_dim;
    for (int i = 0; i < nodes; ++i) {
      std::vector<int> seen(prefix);
      for (int r = 0; r < prefix; ++r) seen[r] = r;
      seen.insert(seen.end(), path[i].begin(), path[i].end());
      EXPECT_LT(worst_error(s, q, i, k, v, seen, tree_out), 1e-2) << "node " << i;
      // Alone: the path's keys and values moved right after the prefix, the node's query the last of them.
      const std::vector<Bf16> k_alone = with_rows_moved(k, path[i], prefix, row_size);
      const std::vector<Bf16> v_alone = with_rows_moved(v, path[i], prefix, row_size);
      const std::vector<Bf16> q_alone(q.begin() + static_cast<size_t>(i) * per_token, q.begin() + static_cast<size_t>(i + 1) * per_token);
      const std::vector<Bf16> alone =
          attend(s, q_alone, k_alone, v_alone, prefix + tree.lengths[i], 1, ck::DecodeTree{}, capacity);
      int differing = 0;
      for (size_t e = 0; e < per_token; ++e) differing += alone[e].bits != tree_out[i * per_token + e].bits;
      EXPECT_EQ(differing, 0) << "node " << i << " against its path decoded alone";
    }
    // A chain of 6 queries: query t sees the prefix and the t + 1 rows up to its own.
    const int n = 6;
    const std::vector<Bf16> chain_out = attend(s, q, k, v, prefix + n, n, ck::DecodeTree{}, capacity);
    for (int t = 0; t < n; ++t) {
      const std::vector<Bf16> q_alone(q.begin() + static_cast<size_t>(t) * per_token, q.begin() + static_cast<size_t>(t + 1) * per_token);
      const std::vector<Bf16> alone = attend(s, q_alone, k, v, prefix + t + 1, 1, ck::DecodeTree{}, capacity);
      int differing = 0;
      for (size_t e = 0; e < per_token; ++e) differing += alone[e].bits != chain_out[t * per_token + e].bits;
      EXPECT_EQ(differing, 0) << "chain query " << t << " against itself alone";
    }
  }
}

// How a block tiles queries (its heads of a KV head, its tokens of the
// step) decides which rows it loads once for several of them, never a
// query's arithmetic: a chain's and a tree's outputs are bitwise the same
// under every cap, down to one query a block; a cap that is not a power of
// two, or beyond what is compiled, is refused by name.
TEST(InvariantAttentionEmulated, AQuerysBitsDoNotDependOnHowBlocksTileTheQueries) {
  std::mt19937 rng(23);
  // Against the default (here 4 heads and one token a block: so few queries
  // fill no grid), the caps alone: one query a block, the compiled maxima
  // (4 heads × 2 tokens here), whole tokens only, and a mix. (Each emulated
  // block runs 256 threads; few calls keep the test short.)
  const std::vector<ck::AttentionTiling> tilings = {{1, 1, 0}, {4, 8, 0}, {1, 4, 0}, {2, 4, 0}};
  {
    const Shape s{8, 2, 16};  // 4 query heads a KV head
    const int prefix = 29, capacity = 64, row_size = s.kv_heads * s.head_dim, n = 6;
    // n nodes after the prefix, rows 4 wide (beyond the longest path, 3).
    const TestTree tree = test_tree({-1, 0, 0, 1, 2, 2}, prefix, /*stride=*/4);
    const std::vector<Bf16> k = random_bf16(static_cast<size_t>(capacity) * row_size, rng);
    const std::vector<Bf16> v = random_bf16(static_cast<size_t>(capacity) * row_size, rng);
    const std::vector<Bf16> q = random_bf16(static_cast<size_t>(n) * s.heads * s.head_dim, rng);
    const std::vector<Bf16> chain = attend(s, q, k, v, prefix + n, n, ck::DecodeTree{}, capacity);
    const std::vector<Bf16> tree_out = attend(s, q, k, v, prefix + n, n, tree.view(), capacity);
    EXPECT_GT(differing_bits(chain, tree_out), 0) << "a tree's nodes see other keys than a chain's queries";
    for (const ck::AttentionTiling& t : tilings) {
      const std::string name = std::to_string(t.max_heads) + " heads, " + std::to_string(t.max_queries) + " queries a block";
      EXPECT_EQ(differing_bits(attend(s, q, k, v, prefix + n, n, ck::DecodeTree{}, capacity, t), chain), 0) << "chain, " << name;
      EXPECT_EQ(differing_bits(attend(s, q, k, v, prefix + n, n, tree.view(), capacity, t), tree_out), 0) << "tree, " << name;
    }
  }
  const Shape small{4, 2, 16};
  const std::vector<Bf16> k(16 * 2 * 16), v(16 * 2 * 16), q(4 * 16);
  for (const ck::AttentionTiling& bad : {ck::AttentionTiling{3, 8}, ck::AttentionTiling{4, 16}, ck::AttentionTiling{0, 8}}) {
    try {
      (void)attend(small, q, k, v, 1, 1, ck::DecodeTree{}, 16, bad);
      ADD_FAILURE() << "a cap of " << bad.max_heads << " heads, " << bad.max_queries << " queries was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("powers of two"), std::string::npos) << e.what();
    }
  }
}

// The same checks on fp32 elements (the kernel instantiated at float, which
// only this test does): a bf16 output rounds away most changes to the order
// of its fp32 sums, an fp32 output shows them. A tree node gets bitwise its
// path alone, a chain query itself alone, under the compiled maxima and under
// one query a block. (Reversing the order the slices' sums are added in, for
// one-head blocks only, fails this test and passes the bf16 ones.)
template <class T>
using AlignedRows = std::unique_ptr<T[], decltype(&std::free)>;

// 64-byte aligned, as the kernel's 8-wide packs of floats need.
AlignedRows<float> aligned_floats(size_t n) {
  return AlignedRows<float>(static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64)), &std::free);
}

AlignedRows<float> random_floats(size_t n, std::mt19937& rng) {
  AlignedRows<float> rows = aligned_floats(n);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (size_t i = 0; i < n; ++i) rows[i] = normal(rng);
  return rows;
}

TEST(InvariantAttentionEmulated, InFp32ANodeAndAChainQueryGetTheirBitsAloneUnderEveryTiling) {
  std::mt19937 rng(31);
  const Shape s{8, 2, 16};
  const int prefix = 29, capacity = 64, row_size = s.kv_heads * s.head_dim, n = 5;
  const TestTree tree = test_tree({-1, 0, 0, 1, 2}, prefix);
  const size_t pool = static_cast<size_t>(capacity) * row_size, per_token = static_cast<size_t>(s.heads) * s.head_dim;
  const AlignedRows<float> k = random_floats(pool, rng), v = random_floats(pool, rng), q = random_floats(n * per_token, rng);
  const auto attend_fp32 = [&](const float* qs, const float* ks, const float* vs, int keys, int tokens,
                               const ck::DecodeTree& tree, const ck::AttentionTiling& tiling) {
    std::vector<float> out(static_cast<size_t>(tokens) * per_token);
    const int32_t cu_k[2] = {0, capacity}, seqused[1] = {keys};
    ck::invariant_decode_attention_typed<float>(qs, ks, vs, cu_k, seqused, tree, out.data(), tokens, tokens, s.heads,
                                                s.kv_heads, s.head_dim, capacity, nullptr, tiling);
    return out;
  };
  const auto same_bits = [](const float* a, const float* b, size_t count) { return std::memcmp(a, b, count * sizeof(float)) == 0; };
  for (const ck::AttentionTiling& tiling : {ck::AttentionTiling{4, 8, 0}, ck::AttentionTiling{1, 1, 0}}) {
    SCOPED_TRACE(std::to_string(tiling.max_heads) + " heads, " + std::to_string(tiling.max_queries) + " queries a block");
    const std::vector<float> tree_out =
        attend_fp32(q.get(), k.get(), v.get(), prefix + n, n, tree.view(), tiling);
    const std::vector<float> chain_out = attend_fp32(q.get(), k.get(), v.get(), prefix + n, n, ck::DecodeTree{}, tiling);
    for (int i = 0; i < n; ++i) {
      const AlignedRows<float> k_alone = aligned_floats(pool), v_alone = aligned_floats(pool);
      std::memcpy(k_alone.get(), k.get(), pool * sizeof(float));
      std::memcpy(v_alone.get(), v.get(), pool * sizeof(float));
      move_rows(k_alone.get(), k.get(), tree.path[i], prefix, row_size);  // the path's rows right after the prefix
      move_rows(v_alone.get(), v.get(), tree.path[i], prefix, row_size);
      const float* q_i = q.get() + i * per_token;
      const std::vector<float> node_alone =
          attend_fp32(q_i, k_alone.get(), v_alone.get(), prefix + tree.lengths[i], 1, ck::DecodeTree{}, ck::AttentionTiling{});
      EXPECT_TRUE(same_bits(node_alone.data(), tree_out.data() + i * per_token, per_token)) << "node " << i;
      const std::vector<float> query_alone =
          attend_fp32(q_i, k.get(), v.get(), prefix + i + 1, 1, ck::DecodeTree{}, ck::AttentionTiling{});
      EXPECT_TRUE(same_bits(query_alone.data(), chain_out.data() + i * per_token, per_token)) << "chain query " << i;
    }
  }
}

// Batched generation: one token of each of 5 sessions (n = 1) in one call,
// their rows in one pool (each session's token in blocks of its own, at its
// own base row): each gets bitwise what its session's token gets alone.
TEST(InvariantAttentionEmulated, ASessionsTokenAmongOtherSessionsGetsItsBitsAlone) {
  std::mt19937 rng(11);
  const Shape s{4, 2, 16};
  const int capacity = 48, row_size = s.kv_heads * s.head_dim, sessions = 5;
  const std::vector<int32_t> cu_k = {0, capacity, 2 * capacity, 3 * capacity, 4 * capacity, 5 * capacity};
  const std::vector<int32_t> seqused = {3, 40, 17, 48, 1};
  const std::vector<Bf16> k = random_bf16(static_cast<size_t>(sessions) * capacity * row_size, rng);
  const std::vector<Bf16> v = random_bf16(static_cast<size_t>(sessions) * capacity * row_size, rng);
  const std::vector<Bf16> q = random_bf16(static_cast<size_t>(sessions) * s.heads * s.head_dim, rng);
  const size_t per_token = static_cast<size_t>(s.heads) * s.head_dim;
  std::vector<Bf16> together(sessions * per_token);
  ck::invariant_decode_attention(ck::Element::kBFloat16, q.data(), k.data(), v.data(), cu_k.data(), seqused.data(),
                                 ck::DecodeTree{}, together.data(), sessions, 1, s.heads, s.kv_heads, s.head_dim, capacity,
                                 nullptr);
  for (int session = 0; session < sessions; ++session) {
    const size_t first_row = static_cast<size_t>(session) * capacity * row_size;
    const std::vector<Bf16> k_own(k.begin() + first_row, k.begin() + first_row + capacity * row_size);
    const std::vector<Bf16> v_own(v.begin() + first_row, v.begin() + first_row + capacity * row_size);
    const std::vector<Bf16> q_own(q.begin() + session * per_token, q.begin() + (session + 1) * per_token);
    const std::vector<Bf16> alone = attend(s, q_own, k_own, v_own, seqused[session], 1, ck::DecodeTree{}, capacity);
    int differing = 0;
    for (size_t e = 0; e < per_token; ++e) differing += alone[e].bits != together[session * per_token + e].bits;
    EXPECT_EQ(differing, 0) << "session " << session;
    std::vector<int> rows(seqused[session]);
    for (int r = 0; r < seqused[session]; ++r) rows[r] = r;
    EXPECT_LT(worst_error(s, q_own, 0, k_own, v_own, rows, alone), 1e-2) << "session " << session;
  }
}

// The default tiling halves a block's tokens until one session's grid has
// min_blocks blocks (or one token a block), at the scale model's shapes (32
// query heads over 16 KV heads, head_dim 64, 512 keys): a chain's 16 tokens
// one a block, a 65-node tree's two, a 129-node tree's four; the caps alone
// keep the compiled maxima's blocks.
TEST(InvariantAttentionEmulated, TheDefaultTilingFillsTheGridBeforeItSharesRowsAmongTokens) {
  const auto tokens_a_block = [](int64_t n, const ck::AttentionTiling& tiling) {
    const ck::AttentionTile tile = ck::attention_tile(n, 32, 16, 64, 512, tiling);
    EXPECT_EQ(tile.g, 2) << n << " queries: both query heads of a KV head in one block";
    return tile.tk;
  };
  const ck::AttentionTiling fill{}, caps_alone{4, 8, 0};
  EXPECT_EQ(tokens_a_block(1, fill), 1);
  EXPECT_EQ(tokens_a_block(16, fill), 1);   // 256 blocks
  EXPECT_EQ(tokens_a_block(33, fill), 1);   // 528
  EXPECT_EQ(tokens_a_block(65, fill), 2);   // 528
  EXPECT_EQ(tokens_a_block(129, fill), 4);  // 528
  for (int64_t n : {16, 65, 129}) EXPECT_EQ(tokens_a_block(n, caps_alone), 4) << n << " queries";
  EXPECT_EQ(tokens_a_block(129, ck::AttentionTiling{4, 8, 1024}), 2);
}

}  // namespace
