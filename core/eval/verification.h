// How a speculative step verifies its drafts, apart from the decoding itself:
// the command line (cli_options) builds eval's arms from these without
// pulling in the plugin host.
#pragma once

#include <cstdint>
#include <string>

namespace dflash::eval {

// One chain (the drafter's greedy block), or a tree (DDTree, draft_tree.h):
// the best `tree_nodes` paths through the drafter's top candidates at each
// block position, verified with the newest token in one target pass
// (decode_verify_tree), the accepted path kept (decode_accept_path).
struct Verification {
  enum class Kind { kChain, kTree };
  Kind kind = Kind::kChain;
  int64_t tree_nodes = 0;  // drafted nodes per step (the newest token not counted); tree only
};

// An arm's name in eval's comparison and console: "chain" or "tree 16".
inline std::string arm_label(const Verification& v) {
  return v.kind == Verification::Kind::kTree ? "tree " + std::to_string(v.tree_nodes) : "chain";
}

// The same without the space, for TensorBoard tags (eval/tree16/tau_mean).
inline std::string arm_tag(const Verification& v) {
  return v.kind == Verification::Kind::kTree ? "tree" + std::to_string(v.tree_nodes) : "chain";
}

}  // namespace dflash::eval
