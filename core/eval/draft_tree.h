// A draft tree from one block pass of a drafter (DDTree: Ringel & Romano,
// arXiv 2604.12989): the drafter gives, for each of the D positions after
// the newest token, its best k tokens with their log-probabilities. A path
// t_1 … t_d through the positions is scored by Σ log q_i(t_i) (the block
// drafter predicts the positions independently), and the tree is the N
// best-scoring paths, found best-first: a node's first child and its next
// sibling enter the frontier only when the node itself is taken. Since
// every log-probability is ≤ 0 a path never outscores its prefix, so the N
// best form a tree (every node's parent is in it), and the nodes come out
// parents first.
//
// Plain host code: no tensors, no device. The target then verifies the
// newest token and the tree in one pass (decode_verify_tree), and
// accepted_path walks it against the target's greedy choices.
#pragma once

#include <cstdint>
#include <vector>

namespace dflash::eval {

// The drafter's candidates: tokens[d][r] with log_probs[d][r] at position
// d + 1 after the newest token, best first (log_probs[d] non-increasing).
struct PositionCandidates {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<float>> log_probs;
};

// The tree, nodes in the order best-first took them (parents first).
struct DraftTree {
  std::vector<int64_t> tokens;   // the node's token
  std::vector<int64_t> parents;  // the parent node's index, or −1: the newest token
  std::vector<int64_t> depths;   // 1 for a child of the newest token
  std::vector<double> scores;    // the path's Σ log q
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

// The candidates put at temperature T, in place: each position's log-probabilities divided
// by T and normalised again over the candidates listed, order kept. T < 1
// trusts the drafter's first choices more, so the budget goes deeper along
// them; T > 1 spreads it wider. Why it helps: a block drafter's distribution
// at a position is a marginal over what it is unsure of before it, while a
// node is verified only where its whole path already matched, and there the
// first choice is right more often than its marginal says (docs/eval.md,
// "Tree temperature"). The normaliser is the listed candidates' (the tail
// beyond them is not known here); at T = 1 nothing changes. Throws
// std::invalid_argument for T not > 0 and finite (valid_tree_temperature).
void temper(PositionCandidates& candidates, double temperature);

// The `budget` best paths (fewer when the candidates hold fewer). Throws
// std::invalid_argument naming what is wrong: a budget < 1, positions whose
// token and log-prob lists differ in length, a list not best first, or a
// log-prob above 0 or not a number.
DraftTree build_draft_tree(const PositionCandidates& candidates, int64_t budget);

// The walk against the target's greedy choices. choices[0] is the target's
// choice after the newest token, choices[1 + i] its choice after node i.
// Returns the accepted nodes in order (each the previous one's child whose
// token equals the target's choice there); the target's choice after the
// last of them (or after the newest token, when none) is the bonus token.
std::vector<int64_t> accepted_path(const DraftTree& tree, const std::vector<int64_t>& choices);

}  // namespace dflash::eval
