// The draft tree (core/eval/draft_tree.h) against a brute-force reference:
// every path through the candidates scored, the best `budget` taken.
#include "eval/draft_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::eval {
namespace {

// Token of candidate r at position d (1-based): unique, so a path is its tokens.
int64_t token_of(int64_t d, int64_t r) { return 1000 * d + r; }

PositionCandidates random_candidates(int64_t positions, int64_t k, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-6.f, 0.f);
  PositionCandidates c;
  for (int64_t d = 1; d <= positions; ++d) {
    std::vector<float> lps(static_cast<size_t>(k));
    for (float& x : lps) x = u(gen);
    std::sort(lps.rbegin(), lps.rend());
    std::vector<int64_t> tokens;
    for (int64_t r = 0; r < k; ++r) tokens.push_back(token_of(d, r));
    c.tokens.push_back(tokens);
    c.log_probs.push_back(lps);
  }
  return c;
}

struct Path {
  std::vector<int64_t> tokens;
  double score = 0;
};

// Every path of depth 1..D, scored as the tree scores it (summed from depth 1).
std::vector<Path> all_paths(const PositionCandidates& c) {
  std::vector<Path> out, level{Path{}};
  for (size_t d = 0; d < c.tokens.size(); ++d) {
    std::vector<Path> next;
    for (const Path& p : level)
      for (size_t r = 0; r < c.tokens[d].size(); ++r) {
        Path q = p;
        q.tokens.push_back(c.tokens[d][r]);
        q.score = p.score + static_cast<double>(c.log_probs[d][r]);
        next.push_back(q);
      }
    out.insert(out.end(), next.begin(), next.end());
    level = next;
  }
  return out;
}

// The tree's paths, root to node, one per node.
std::set<std::vector<int64_t>> tree_paths(const DraftTree& t) {
  std::set<std::vector<int64_t>> out;
  for (int64_t i = 0; i < t.size(); ++i) {
    std::vector<int64_t> path;
    for (int64_t at = i; at >= 0; at = t.parents[static_cast<size_t>(at)]) path.insert(path.begin(), t.tokens[static_cast<size_t>(at)]);
    out.insert(path);
  }
  return out;
}

TEST(DraftTree, TakesTheBestPathsAsABruteForceRankingDoes) {
  for (uint32_t seed = 0; seed < 5; ++seed) {
    const PositionCandidates c = random_candidates(/*positions=*/4, /*k=*/3, seed);
    std::vector<Path> paths = all_paths(c);  // 3 + 9 + 27 + 81 = 120
    ASSERT_EQ(paths.size(), 120u);
    std::sort(paths.begin(), paths.end(), [](const Path& a, const Path& b) { return a.score > b.score; });
    for (int64_t budget : {1, 2, 5, 16, 32, 64, 119, 120, 500}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + ", budget " + std::to_string(budget));
      const DraftTree t = build_draft_tree(c, budget);
      const int64_t expected = std::min<int64_t>(budget, 120);
      ASSERT_EQ(t.size(), expected);
      std::set<std::vector<int64_t>> best;
      for (int64_t i = 0; i < expected; ++i) best.insert(paths[static_cast<size_t>(i)].tokens);
      EXPECT_EQ(tree_paths(t), best);
      // Parents first; depth and score follow from the parent; scores come out best first.
      for (int64_t i = 0; i < t.size(); ++i) {
        const int64_t p = t.parents[static_cast<size_t>(i)];
        ASSERT_LT(p, i);
        const int64_t parent_depth = p < 0 ? 0 : t.depths[static_cast<size_t>(p)];
        const double parent_score = p < 0 ? 0.0 : t.scores[static_cast<size_t>(p)];
        EXPECT_EQ(t.depths[static_cast<size_t>(i)], parent_depth + 1);
        const int64_t d = t.depths[static_cast<size_t>(i)];
        const int64_t r = t.tokens[static_cast<size_t>(i)] - 1000 * d;
        EXPECT_EQ(t.scores[static_cast<size_t>(i)], parent_score + static_cast<double>(c.log_probs[static_cast<size_t>(d - 1)][static_cast<size_t>(r)]));
        if (i > 0) EXPECT_LE(t.scores[static_cast<size_t>(i)], t.scores[static_cast<size_t>(i - 1)]);
      }
    }
  }
}

TEST(DraftTree, OneCandidateAPositionIsTheChain) {
  const PositionCandidates c = random_candidates(/*positions=*/6, /*k=*/1, 7);
  const DraftTree t = build_draft_tree(c, 64);
  ASSERT_EQ(t.size(), 6);
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(t.parents[static_cast<size_t>(i)], i - 1);
    EXPECT_EQ(t.tokens[static_cast<size_t>(i)], token_of(i + 1, 0));
  }
}

TEST(DraftTree, ImpossibleCandidatesGetNoNode) {
  PositionCandidates c;
  const float none = -std::numeric_limits<float>::infinity();
  c.tokens = {{5, 6, 7}, {8, 9}};
  c.log_probs = {{-0.1f, -2.f, none}, {-0.5f, none}};
  const DraftTree t = build_draft_tree(c, 10);
  EXPECT_EQ(t.size(), 4);  // 5, 6, 5→8, 6→8
  EXPECT_EQ(tree_paths(t), (std::set<std::vector<int64_t>>{{5}, {6}, {5, 8}, {6, 8}}));
}

// The tempered candidates: log-probabilities divided by T and normalised
// again over the candidates listed, best first as before; T = 1 changes
// nothing (DDTree's own rule).
TEST(DraftTree, TemperatureRescalesAndRenormalisesEachPosition) {
  // A copy put at temperature t.
  auto tempered = [](PositionCandidates candidates, double t) {
    temper(candidates, t);
    return candidates;
  };
  const PositionCandidates c = random_candidates(/*positions=*/3, /*k=*/5, 11);
  const PositionCandidates same = tempered(c, 1.0);
  EXPECT_EQ(same.tokens, c.tokens);
  EXPECT_EQ(same.log_probs, c.log_probs);
  for (double t : {0.5, 0.7, 2.0}) {
    SCOPED_TRACE("T = " + std::to_string(t));
    const PositionCandidates h = tempered(c, t);
    ASSERT_EQ(h.tokens, c.tokens);
    for (size_t d = 0; d < c.log_probs.size(); ++d) {
      double mass = 0;
      for (size_t r = 0; r < c.log_probs[d].size(); ++r) {
        mass += std::exp(static_cast<double>(h.log_probs[d][r]));
        if (r > 0) EXPECT_LE(h.log_probs[d][r], h.log_probs[d][r - 1]);
        // Differences between candidates scale by 1 / T.
        const double want = (static_cast<double>(c.log_probs[d][r]) - c.log_probs[d][0]) / t;
        EXPECT_NEAR(static_cast<double>(h.log_probs[d][r]) - h.log_probs[d][0], want, 1e-5);
      }
      EXPECT_NEAR(mass, 1.0, 1e-5);
    }
  }
  // An impossible candidate stays impossible.
  PositionCandidates with_none;
  with_none.tokens = {{5, 6}};
  with_none.log_probs = {{-0.2f, -std::numeric_limits<float>::infinity()}};
  const PositionCandidates h = tempered(with_none, 0.5);
  EXPECT_FLOAT_EQ(h.log_probs[0][0], 0.f);
  EXPECT_TRUE(std::isinf(h.log_probs[0][1]));
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    try {
      PositionCandidates copy = c;
      temper(copy, bad);
      ADD_FAILURE() << "temperature " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("it must be a finite number above 0"), std::string::npos) << e.what();
    }
  }
}

// Why a temperature below 1: a sharper drafter's tree spends the budget along
// its first choices. Here the first choice is likely at every position but
// the second is not far behind: at T = 1 four nodes branch at the first two
// positions; at T = 0.25 they are the chain of first choices, four deep.
TEST(DraftTree, ALowTemperatureBuysDepthAlongTheFirstChoices) {
  PositionCandidates c;
  for (int64_t d = 1; d <= 4; ++d) {
    c.tokens.push_back({token_of(d, 0), token_of(d, 1)});
    c.log_probs.push_back({std::log(0.6f), std::log(0.4f)});
  }
  const DraftTree wide = build_draft_tree(c, 4);
  int64_t wide_depth = 0;
  for (int64_t depth : wide.depths) wide_depth = std::max(wide_depth, depth);
  EXPECT_EQ(wide_depth, 2);
  temper(c, 0.25);
  const DraftTree deep = build_draft_tree(c, 4);
  ASSERT_EQ(deep.size(), 4);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(deep.parents[static_cast<size_t>(i)], i - 1);
    EXPECT_EQ(deep.tokens[static_cast<size_t>(i)], token_of(i + 1, 0));
  }
}

TEST(DraftTree, BadInputIsRefusedByName) {
  PositionCandidates c = random_candidates(2, 2, 1);
  auto message = [](const PositionCandidates& cand, int64_t budget) {
    try {
      build_draft_tree(cand, budget);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(c, 0).find("node budget is 0"), std::string::npos) << message(c, 0);
  PositionCandidates uneven = c;
  uneven.tokens[1].push_back(3);
  EXPECT_NE(message(uneven, 4).find("position 2 has 3 tokens but 2 log-probabilities"), std::string::npos) << message(uneven, 4);
  PositionCandidates unsorted = c;
  std::swap(unsorted.log_probs[0][0], unsorted.log_probs[0][1]);
  EXPECT_NE(message(unsorted, 4).find("not best first"), std::string::npos) << message(unsorted, 4);
  PositionCandidates positive = c;
  positive.log_probs[1][0] = 0.5f;
  EXPECT_NE(message(positive, 4).find("is not a log-probability"), std::string::npos) << message(positive, 4);
  PositionCandidates nan = c;
  nan.log_probs[0][1] = std::nanf("");
  EXPECT_NE(message(nan, 4).find("position 1, candidate 1"), std::string::npos) << message(nan, 4);
  PositionCandidates lopsided = c;
  lopsided.log_probs.pop_back();
  EXPECT_NE(message(lopsided, 4).find("2 positions of tokens but 1 of log-probabilities"), std::string::npos)
      << message(lopsided, 4);
}

TEST(DraftTree, TheWalkFollowsTheTargetsChoices) {
  // Newest token → {10 (node 0), 11 (node 1)}; 10 → {20 (node 2), 21 (node 3)}; 21 → {30 (node 4)}.
  DraftTree t;
  t.tokens = {10, 11, 20, 21, 30};
  t.parents = {-1, -1, 0, 0, 3};
  t.depths = {1, 1, 2, 2, 3};
  t.scores = {-0.1, -0.2, -0.3, -0.4, -0.5};
  // choices[0]: after the newest token; choices[1 + i]: after node i.
  EXPECT_EQ(accepted_path(t, {10, 21, 0, 0, 30, 99}), (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(accepted_path(t, {11, 0, 7, 0, 0, 0}), (std::vector<int64_t>{1}));
  EXPECT_EQ(accepted_path(t, {10, 20, 0, 5, 0, 0}), (std::vector<int64_t>{0, 2}));
  EXPECT_TRUE(accepted_path(t, {12, 20, 0, 0, 0, 0}).empty());
  EXPECT_THROW(accepted_path(t, {10, 21}), std::invalid_argument);
}

}  // namespace
}  // namespace dflash::eval
