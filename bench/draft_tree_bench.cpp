// How long the host takes to build a DDTree draft tree (core/eval/draft_tree.h)
// from a drafter's top-k candidates, at the node budgets of the GPU
// demonstration's sweep: the figure that says whether building the tree on
// the device would pay (docs/eval.md, "Draft trees"). A program, not a test.
//
//   draft_tree_bench [--positions 15] [--repeats 2000] [--seed 1]
//
// Candidates: k = the budget per position (as eval asks the drafter for),
// log-probabilities |N(0, 3)| below zero, sorted best first, as top-k gives.
#include "bench_args.h"
#include "eval/draft_tree.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <random>

int main(int argc, char** argv) try {
  int64_t positions = 15, repeats = 2000, seed = 1;
  dflash::bench::FlagReader r(argc, argv);
  while (r.next()) {
    if (r.is("--positions")) positions = r.integer();
    else if (r.is("--repeats")) repeats = r.integer();
    else if (r.is("--seed")) seed = r.integer();
    else r.unknown();
  }
  if (positions < 1 || repeats < 1) throw std::invalid_argument("--positions and --repeats must be at least 1");
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.f, 3.f);
  for (int64_t budget : {16, 32, 64, 128}) {
    dflash::eval::PositionCandidates candidates;
    for (int64_t d = 0; d < positions; ++d) {
      std::vector<float> log_probs(static_cast<size_t>(budget));
      for (float& v : log_probs) v = -std::fabs(normal(rng));
      std::sort(log_probs.begin(), log_probs.end(), std::greater<float>());
      std::vector<int64_t> tokens(static_cast<size_t>(budget));
      for (int64_t i = 0; i < budget; ++i) tokens[static_cast<size_t>(i)] = i;
      candidates.tokens.push_back(tokens);
      candidates.log_probs.push_back(log_probs);
    }
    int64_t nodes = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < repeats; ++i) nodes += dflash::eval::build_draft_tree(candidates, budget).size();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    std::printf("budget %3lld: %.1f us a tree (%lld nodes, %lld positions, k %lld)\n", static_cast<long long>(budget),
                us / static_cast<double>(repeats), static_cast<long long>(nodes / repeats),
                static_cast<long long>(positions), static_cast<long long>(budget));
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "draft_tree_bench: " << e.what() << "\n";
  return 2;
}
