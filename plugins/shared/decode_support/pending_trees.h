// The draft trees a target has verified and not yet cut back to one path
// (ABI 1.4's decode_verify_tree / decode_accept_path), per decoding
// session: the rules both Hugging Face targets follow, in one place. A tree
// is pending from its verification to its acceptance; meanwhile its session
// takes no other step (the cache past the session's length holds the whole
// tree, which no other call may read or overwrite).
//
// Header-only and torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::decode_support {

// Node depths (1 for a child of the last cached token) from parent indices,
// each in [−1, i); throws std::invalid_argument naming the node otherwise.
inline std::vector<int64_t> tree_depths(const std::vector<int64_t>& parents) {
  std::vector<int64_t> depths(parents.size());
  for (size_t i = 0; i < parents.size(); ++i) {
    const int64_t p = parents[i];
    if (p < -1 || p >= static_cast<int64_t>(i))
      throw std::invalid_argument("decode_verify_tree: node " + std::to_string(i) + "'s parent " + std::to_string(p) +
                                  " is not in [-1, " + std::to_string(i) + ") (parents come before their children)");
    depths[i] = p < 0 ? 1 : depths[static_cast<size_t>(p)] + 1;
  }
  return depths;
}

// A decode_verify_tree request's checks that need no tensor, as every target
// makes them before touching its session: one token per parent, parents
// before their children (tree_depths), and the deepest path within the
// session's max_length (`capacity`) after its `length` cached tokens.
// Returns the node depths; throws std::invalid_argument naming what is wrong.
inline std::vector<int64_t> checked_tree_depths(int64_t session, int64_t tokens, const std::vector<int64_t>& parents,
                                                int64_t length, int64_t capacity) {
  const auto n = static_cast<int64_t>(parents.size());
  if (n < 1 || tokens != n)
    throw std::invalid_argument("decode_verify_tree: " + std::to_string(tokens) + " tokens for " + std::to_string(n) + " parents");
  std::vector<int64_t> depths = tree_depths(parents);
  int64_t deepest = 0;
  for (int64_t d : depths) deepest = d > deepest ? d : deepest;
  if (length + deepest > capacity)
    throw std::invalid_argument("decode_verify_tree: session " + std::to_string(session) + ": the tree's deepest path of " +
                                std::to_string(deepest) + " tokens would make " + std::to_string(length + deepest) +
                                ", beyond the session's max_length " + std::to_string(capacity));
  return depths;
}

// The tree arguments of the row-invariant decoding attention
// (kernel_ops::invariant_decode_attention): node i's path from the root,
// itself last, as session rows first_row + node, in row i of a
// [nodes, stride] table (zeros past the path), and its length (its depth).
// The stride is at least kMinTreePathStride, doubled while the deepest path
// is longer, so the trees of one node count share one CUDA graph whatever
// their depth. (Rounding each tree's depth up to a power of two gave a
// budget up to five graph shapes, 1 to 16 wide, each run eagerly on its
// first use and captured on its second, inside the timed decoding: on the
// eighth GPU run, docs/eval.md, the scale model's 32-node trees captured 5
// graphs more than its chain.) The padding costs a few bytes a node: the
// attention reads a path's rows only up to its length. `depths` as
// tree_depths gives them for `parents`.
constexpr int64_t kMinTreePathStride = 16;  // a DFlash block's depth
struct TreePathRows {
  std::vector<int32_t> rows, lengths;
  int64_t stride = kMinTreePathStride;
};
inline TreePathRows tree_path_rows(const std::vector<int64_t>& parents, const std::vector<int64_t>& depths,
                                   int64_t first_row) {
  TreePathRows out;
  for (int64_t d : depths)
    while (out.stride < d) out.stride *= 2;
  const auto n = static_cast<int64_t>(parents.size());
  out.rows.assign(static_cast<size_t>(n * out.stride), 0);
  out.lengths.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = depths[static_cast<size_t>(i)];
    out.lengths[static_cast<size_t>(i)] = static_cast<int32_t>(d);
    for (int64_t a = i; a >= 0; a = parents[static_cast<size_t>(a)])
      out.rows[static_cast<size_t>(i * out.stride + --d)] = static_cast<int32_t>(first_row + a);
  }
  return out;
}

class PendingTrees {
 public:
  struct Tree {
    int64_t length = 0;            // the session's length when the tree was verified
    std::vector<int64_t> parents;  // as verified
  };

  // Throws std::invalid_argument when `session` has a pending tree: `call`
  // (decode_extend, decode_truncate, ...) must wait for decode_accept_path.
  void require_none(int64_t session, const char* call) const {
    if (trees_.count(session) > 0)
      throw std::invalid_argument(std::string(call) + ": session " + std::to_string(session) +
                                  " has a verified draft tree pending; call decode_accept_path first");
  }
  void add(int64_t session, Tree tree) { trees_[session] = std::move(tree); }
  // The pending tree of `session` after checking that `path` is a chain of
  // it from a child of the last cached token; throws std::invalid_argument
  // naming the offending entry. The tree stays pending (take() removes it).
  const Tree& check_path(int64_t session, const std::vector<int64_t>& path) const {
    const auto found = trees_.find(session);
    if (found == trees_.end())
      throw std::invalid_argument("decode_accept_path: session " + std::to_string(session) +
                                  " has no verified draft tree (call decode_verify_tree first)");
    const Tree& tree = found->second;
    int64_t parent = -1;
    for (size_t j = 0; j < path.size(); ++j) {
      const int64_t node = path[j];
      if (node < 0 || node >= static_cast<int64_t>(tree.parents.size()))
        throw std::invalid_argument("decode_accept_path: path entry " + std::to_string(j) + " is node " + std::to_string(node) +
                                    ", outside the tree's " + std::to_string(tree.parents.size()) + " nodes");
      if (tree.parents[static_cast<size_t>(node)] != parent)
        throw std::invalid_argument("decode_accept_path: path entry " + std::to_string(j) + " (node " + std::to_string(node) +
                                    ") hangs below node " + std::to_string(tree.parents[static_cast<size_t>(node)]) +
                                    ", not below " + (parent < 0 ? std::string("the last cached token") : "node " + std::to_string(parent)));
      parent = node;
    }
    return tree;
  }
  void take(int64_t session) { trees_.erase(session); }

 private:
  std::map<int64_t, Tree> trees_;
};

}  // namespace dflash::decode_support
