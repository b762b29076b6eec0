#include "eval/draft_tree.h"

#include "eval/verification.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <stdexcept>
#include <string>

namespace dflash::eval {
namespace {

// A path not yet taken: the rank-th candidate at `depth` below `parent`.
struct Frontier {
  double score = 0;
  int64_t parent = -1, depth = 1, rank = 0;
  int64_t order = 0;  // ties go to the earlier entry: the tree does not depend on the heap's layout
};
struct Worse {
  bool operator()(const Frontier& a, const Frontier& b) const {
    return a.score < b.score || (a.score == b.score && a.order > b.order);
  }
};

void check_candidates(const PositionCandidates& c) {
  if (c.tokens.size() != c.log_probs.size())
    throw std::invalid_argument("draft tree: " + std::to_string(c.tokens.size()) + " positions of tokens but " +
                                std::to_string(c.log_probs.size()) + " of log-probabilities");
  for (size_t d = 0; d < c.tokens.size(); ++d) {
    const std::string where = "draft tree: position " + std::to_string(d + 1);
    if (c.tokens[d].size() != c.log_probs[d].size())
      throw std::invalid_argument(where + " has " + std::to_string(c.tokens[d].size()) + " tokens but " +
                                  std::to_string(c.log_probs[d].size()) + " log-probabilities");
    for (size_t r = 0; r < c.log_probs[d].size(); ++r) {
      const float lp = c.log_probs[d][r];
      if (std::isnan(lp) || lp > 1e-6f)
        throw std::invalid_argument(where + ", candidate " + std::to_string(r) + ": log-probability " + std::to_string(lp) +
                                    " is not a log-probability (≤ 0)");
      if (r > 0 && lp > c.log_probs[d][r - 1])
        throw std::invalid_argument(where + ": candidates are not best first (" + std::to_string(r) + " scores above " +
                                    std::to_string(r - 1) + ")");
    }
  }
}

}  // namespace

DraftTree build_draft_tree(const PositionCandidates& candidates, int64_t budget) {
  if (budget < 1) throw std::invalid_argument("draft tree: the node budget is " + std::to_string(budget) + "; it must be at least 1");
  check_candidates(candidates);
  const auto positions = static_cast<int64_t>(candidates.tokens.size());
  // log q of candidate (depth, rank), or −inf where there is none (or it is impossible).
  auto log_q = [&](int64_t depth, int64_t rank) {
    if (depth > positions) return -std::numeric_limits<double>::infinity();
    const auto& lps = candidates.log_probs[static_cast<size_t>(depth - 1)];
    if (rank >= static_cast<int64_t>(lps.size())) return -std::numeric_limits<double>::infinity();
    return std::min(0.0, static_cast<double>(lps[static_cast<size_t>(rank)]));
  };
  DraftTree tree;
  std::priority_queue<Frontier, std::vector<Frontier>, Worse> frontier;
  int64_t pushed = 0;
  auto offer = [&](int64_t parent, double parent_score, int64_t depth, int64_t rank) {
    const double lq = log_q(depth, rank);
    if (std::isinf(lq)) return;  // no such candidate, or probability 0: never worth a node
    frontier.push(Frontier{parent_score + lq, parent, depth, rank, pushed++});
  };
  offer(-1, 0.0, 1, 0);
  while (tree.size() < budget && !frontier.empty()) {
    const Frontier f = frontier.top();
    frontier.pop();
    const int64_t node = tree.size();
    tree.tokens.push_back(candidates.tokens[static_cast<size_t>(f.depth - 1)][static_cast<size_t>(f.rank)]);
    tree.parents.push_back(f.parent);
    tree.depths.push_back(f.depth);
    tree.scores.push_back(f.score);
    offer(node, f.score, f.depth + 1, 0);  // its best child
    const double parent_score = f.parent < 0 ? 0.0 : tree.scores[static_cast<size_t>(f.parent)];
    offer(f.parent, parent_score, f.depth, f.rank + 1);  // its next sibling
  }
  return tree;
}

void temper(PositionCandidates& candidates, double temperature) {
  if (!valid_tree_temperature(temperature))
    throw std::invalid_argument("draft tree: the temperature is " + std::to_string(temperature) +
                                "; it must be a finite number above 0 (1: DDTree's own rule)");
  if (temperature == 1.0) return;
  for (std::vector<float>& lps : candidates.log_probs) {
    if (lps.empty()) continue;
    // log Σ exp(lp / T), from the largest (the first: candidates are best first).
    const double top = static_cast<double>(lps.front()) / temperature;
    if (!std::isfinite(top)) continue;  // nothing possible here (or not log-probabilities: build_draft_tree says which)
    double sum = 0;
    for (float lp : lps) sum += std::exp(static_cast<double>(lp) / temperature - top);
    const double log_norm = top + std::log(sum);
    for (float& lp : lps) lp = static_cast<float>(std::min(0.0, static_cast<double>(lp) / temperature - log_norm));
  }
}

std::vector<int64_t> accepted_path(const DraftTree& tree, const std::vector<int64_t>& choices) {
  if (static_cast<int64_t>(choices.size()) != tree.size() + 1)
    throw std::invalid_argument("draft tree walk: " + std::to_string(choices.size()) + " target choices for " +
                                std::to_string(tree.size()) + " nodes and the newest token");
  std::vector<int64_t> path;
  int64_t at = -1;  // the newest token
  while (true) {
    const int64_t wanted = choices[static_cast<size_t>(at + 1)];
    int64_t next = -1;
    // Children come after their parent; the first child with the wanted token (tokens of siblings differ).
    for (int64_t i = at + 1; i < tree.size() && next < 0; ++i)
      if (tree.parents[static_cast<size_t>(i)] == at && tree.tokens[static_cast<size_t>(i)] == wanted) next = i;
    if (next < 0) return path;
    path.push_back(next);
    at = next;
  }
}

}  // namespace dflash::eval
