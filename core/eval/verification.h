// How a speculative step verifies its drafts, apart from the decoding itself:
// the command line (cli_options) builds eval's arms from these without
// pulling in the plugin host.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dflash::eval {

// One chain (the drafter's greedy block), or a tree (DDTree, draft_tree.h):
// the best `tree_nodes` paths through the drafter's top candidates at each
// block position, verified with the newest token in one target pass
// (decode_verify_tree), the accepted path kept (decode_accept_path).
//
// tree_temperature: the drafter's distributions are sharpened (< 1) or
// flattened (> 1) before the tree is chosen (draft_tree.h, `temper`); 1 is
// DDTree's own rule. Verification stays the target's greedy choice, so any
// temperature is lossless; it only changes which nodes the budget buys.
struct Verification {
  enum class Kind { kChain, kTree };
  Kind kind = Kind::kChain;
  int64_t tree_nodes = 0;          // drafted nodes per step (the newest token not counted); tree only
  double tree_temperature = 1.0;   // tree only
};

// A tree temperature eval takes: a finite number above 0.
inline bool valid_tree_temperature(double t) { return t > 0 && std::isfinite(t); }

// A temperature as written in labels and tags: 0.7, 1.25.
inline std::string temperature_text(double t) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", t);
  return text;
}

// An arm's name in eval's comparison and console: "chain", "tree 16", or
// "tree 16 T=0.7" for a temperature other than 1.
inline std::string arm_label(const Verification& v) {
  if (v.kind != Verification::Kind::kTree) return "chain";
  return "tree " + std::to_string(v.tree_nodes) +
         (v.tree_temperature == 1.0 ? "" : " T=" + temperature_text(v.tree_temperature));
}

// The same without spaces, for TensorBoard tags (eval/tree16/tau_mean,
// eval/tree16_t0.7/tau_mean).
inline std::string arm_tag(const Verification& v) {
  if (v.kind != Verification::Kind::kTree) return "chain";
  return "tree" + std::to_string(v.tree_nodes) +
         (v.tree_temperature == 1.0 ? "" : "_t" + temperature_text(v.tree_temperature));
}

}  // namespace dflash::eval
