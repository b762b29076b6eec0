#include "eval/speculative.h"

#include "eval/draft_tree.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace dflash::eval {
namespace {

using Clock = std::chrono::steady_clock;

at::Tensor ids_tensor(const std::vector<int64_t>& ids) {
  at::Tensor out = at::empty({static_cast<int64_t>(ids.size())}, at::kLong);
  std::copy(ids.begin(), ids.end(), out.data_ptr<int64_t>());
  return out;
}

// What decode_extend returned under `name`; its absence is the target's bug.
at::Tensor output(const host::NamedTensors& out, const std::string& name, const host::PluginRecord& record) {
  return host::require_tensor(out, name, record.label() + ": decode_extend");
}

// Appends `fresh` to `g` up to the limits; returns whether generation ended.
bool emit(Generation& g, const std::vector<int64_t>& fresh, size_t prompt_length, const DecodeLimits& limits) {
  for (int64_t token : fresh) {
    g.tokens.push_back(token);
    if (const char* reason = stop_reason(token, static_cast<int64_t>(g.tokens.size()), static_cast<int64_t>(prompt_length), limits)) {
      g.stop_reason = reason;
      return true;
    }
  }
  return false;
}

int64_t capacity(const std::vector<int64_t>& prompt, const DecodeLimits& limits) {
  return session_capacity(static_cast<int64_t>(prompt.size()), limits);
}

// Ends a session however the decoding leaves.
struct SessionGuard {
  std::function<void()> end;
  ~SessionGuard() { end(); }
};

}  // namespace

void check_prompt(const std::vector<int64_t>& prompt, const DecodeLimits& limits) {
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty: give at least one token");
  if (limits.max_length > 0 && static_cast<int64_t>(prompt.size()) >= limits.max_length)
    throw std::invalid_argument("the prompt has " + std::to_string(prompt.size()) + " tokens, not fewer than max_length " +
                                std::to_string(limits.max_length) + ": nothing could be generated; shorten it or raise max_length");
}

const char* stop_reason(int64_t token, int64_t generated, int64_t prompt_length, const DecodeLimits& limits) {
  if (std::find(limits.eos_token_ids.begin(), limits.eos_token_ids.end(), token) != limits.eos_token_ids.end()) return "eos";
  if (generated >= limits.max_new_tokens) return "max_new_tokens";
  if (limits.max_length > 0 && prompt_length + generated >= limits.max_length) return "max_length";
  return nullptr;
}

int64_t session_capacity(int64_t prompt_length, const DecodeLimits& limits) {
  const int64_t wanted = prompt_length + limits.max_new_tokens;
  return limits.max_length > 0 ? std::min(limits.max_length, wanted) : wanted;
}

namespace {

// Charges each phase of a decoding to its profile (when there is one):
// the phase's work, then a wait for the device, timed together.
class Phases {
 public:
  explicit Phases(DecodeProfile* profile) : profile_(profile), start_(Clock::now()) {}
  template <class F>
  decltype(auto) time(double DecodeProfile::*bucket, F&& f) {
    if (!profile_) return f();
    const auto begin = Clock::now();
    struct Charge {
      Phases& p;
      double DecodeProfile::*bucket;
      Clock::time_point begin;
      ~Charge() {
        if (p.profile_->sync) p.profile_->sync();
        const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
        p.profile_->*bucket += seconds;
        p.charged_ += seconds;
      }
    } charge{*this, bucket, begin};
    return f();
  }
  // The rest of the call's wall time goes to `other`.
  void finish(const Generation& g) {
    if (!profile_) return;
    if (profile_->sync) profile_->sync();
    const double total = std::chrono::duration<double>(Clock::now() - start_).count();
    profile_->other += std::max(0.0, total - charged_);
    profile_->steps += g.target_passes - 1;
    profile_->tokens += static_cast<int64_t>(g.tokens.size());
  }

 private:
  DecodeProfile* profile_;
  Clock::time_point start_;
  double charged_ = 0;
};

// The greedy choice after the last row of logits [n, V], on their device
// ([1]), and its value read back: the step's one wait for the device.
std::pair<at::Tensor, int64_t> last_choice(const at::Tensor& logits) {
  const at::Tensor best = logits.narrow(0, logits.size(0) - 1, 1).argmax(-1);
  return {best, best.to(at::kCPU).item<int64_t>()};
}

std::vector<int64_t> values_of(const at::Tensor& cpu) {
  const at::Tensor t = cpu.to(at::kLong).contiguous();
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

}  // namespace

Generation greedy_decode(const host::TargetModelInstance& target, const std::vector<int64_t>& prompt,
                         const DecodeLimits& limits, DecodeProfile* profile) {
  check_prompt(prompt, limits);
  const auto start = Clock::now();
  Phases phases(profile);
  Generation g;
  const int64_t session = target.decode_begin(capacity(prompt, limits));
  const SessionGuard guard{[&] { target.decode_end(session); }};
  at::Tensor logits = phases.time(&DecodeProfile::target, [&] {
    return output(target.decode_extend(session, ids_tensor(prompt), {}, true), "logits", target.record());
  });
  ++g.target_passes;
  while (true) {
    // The newest token stays on the device for the next pass; only its value crosses.
    at::Tensor next_on_device;
    int64_t next = 0;
    std::tie(next_on_device, next) = phases.time(&DecodeProfile::accept, [&] { return last_choice(logits); });
    if (emit(g, {next}, prompt.size(), limits)) break;
    logits = phases.time(&DecodeProfile::target, [&] {
      return output(target.decode_extend(session, next_on_device, {}, true), "logits", target.record());
    });
    ++g.target_passes;
  }
  g.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  phases.finish(g);
  return g;
}

Generation speculative_decode(const host::TargetModelInstance& target, const host::DrafterInstance& drafter,
                              const std::vector<int64_t>& prompt, const DecodeLimits& limits, int64_t block_size,
                              const std::vector<int64_t>& layer_ids, DecodeProfile* profile, const Verification& verification) {
  check_prompt(prompt, limits);
  if (block_size < kMinDecodeBlockSize)
    throw std::invalid_argument("block_size is " + std::to_string(block_size) + "; speculative decoding needs at least " +
                                std::to_string(kMinDecodeBlockSize) + " (the newest token + one proposal)");
  const bool tree_mode = verification.kind == Verification::Kind::kTree;
  int64_t candidates_per_position = 0;  // tree: k of the drafter's top-k, as many as a parent could use
  if (tree_mode) {
    if (verification.tree_nodes < 1)
      throw std::invalid_argument("--tree-nodes is " + std::to_string(verification.tree_nodes) + "; a draft tree needs at least 1 node");
    if (!valid_tree_temperature(verification.tree_temperature))
      throw std::invalid_argument("--tree-temperature is " + std::to_string(verification.tree_temperature) +
                                  "; it must be a finite number above 0 (1: DDTree's own rule)");
    if (!target.can_verify_tree())
      throw std::invalid_argument(target.record().label() + " does not verify draft trees (ABI 1.4's decode_verify_tree); "
                                  "use --verify chain, or a target that does");
    if (!drafter.can_draft_topk())
      throw std::invalid_argument(drafter.record().label() + " does not propose a tree's candidates (ABI 1.4's "
                                  "draft_propose_topk); use --verify chain, or a drafter that does");
    const int64_t vocab = target.describe().value("vocab_size", int64_t{0});
    candidates_per_position = vocab > 0 ? std::min(verification.tree_nodes, vocab) : verification.tree_nodes;
  }
  const auto start = Clock::now();
  Phases phases(profile);
  Generation g;
  const int64_t session = target.decode_begin(capacity(prompt, limits));
  const SessionGuard target_guard{[&] { target.decode_end(session); }};
  const int64_t draft = drafter.draft_begin();
  const SessionGuard draft_guard{[&] { drafter.draft_end(draft); }};

  // The drafter's context: accepted tokens (their ids from the host) with the
  // target's features at them (where the target left them).
  // rows: which rows of `out` hold the accepted tokens (a tree's path); by
  // default its first ones.
  auto extend_drafter = [&](const host::NamedTensors& out, const std::vector<int64_t>& accepted,
                            const std::vector<int64_t>& rows = {}) {
    phases.time(&DecodeProfile::extend, [&] {
      host::NamedTensors inputs = {{"input_ids", ids_tensor(accepted)}};
      const auto count = static_cast<int64_t>(accepted.size());
      at::Tensor picked;  // `rows`, uploaded once for every layer's features
      for (int64_t id : layer_ids) {
        const std::string name = "hidden." + std::to_string(id);
        const at::Tensor hidden = output(out, name, target.record());
        if (!rows.empty() && (!picked.defined() || picked.device() != hidden.device()))
          picked = ids_tensor(rows).to(hidden.device(), /*non_blocking=*/true);
        inputs.emplace_back(name, rows.empty() ? hidden.narrow(0, 0, count) : hidden.index_select(0, picked));
      }
      drafter.draft_extend(draft, inputs);
    });
  };
  auto finish = [&] {
    g.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    phases.finish(g);
    return g;
  };

  host::NamedTensors out = phases.time(&DecodeProfile::target, [&] { return target.decode_extend(session, ids_tensor(prompt), layer_ids, true); });
  ++g.target_passes;
  // `next` is the newest token: generated, not yet in the target's cache.
  // next_on_device: the same token where the target's argmax left it.
  at::Tensor next_on_device;
  int64_t next = 0;
  std::tie(next_on_device, next) =
      phases.time(&DecodeProfile::accept, [&] { return last_choice(output(out, "logits", target.record())); });
  extend_drafter(out, prompt);
  if (emit(g, {next}, prompt.size(), limits)) return finish();
  while (true) {
    const int64_t produced = static_cast<int64_t>(g.tokens.size());
    int64_t room = std::min<int64_t>(block_size - 1, limits.max_new_tokens - produced - 1);
    if (limits.max_length > 0) room = std::min<int64_t>(room, limits.max_length - static_cast<int64_t>(prompt.size()) - produced);
    room = std::max<int64_t>(room, 0);
    if (tree_mode && room > 0) {
      // The tree: the drafter's top candidates at each of `room` positions
      // (read back: the tree is built on the host), the best paths under
      // the node budget, verified with the newest token as node 0.
      // Read back in one copy (the step's wait for the drafter).
      at::Tensor tokens_cpu, log_probs_cpu;
      phases.time(&DecodeProfile::propose, [&] {
        const host::DrafterInstance::TopK topk =
            drafter.draft_propose_topk(draft, {{"last_token", ids_tensor({next})}}, room, candidates_per_position);
        const at::Tensor both = at::cat({topk.tokens.to(at::kDouble), topk.log_probs.to(topk.tokens.device(), at::kDouble)}, 1)
                                    .to(at::kCPU);
        const int64_t k = topk.tokens.size(1);
        tokens_cpu = both.narrow(1, 0, k).to(at::kLong).contiguous();
        log_probs_cpu = both.narrow(1, k, k).to(at::kFloat).contiguous();
      });
      const int64_t positions = tokens_cpu.size(0);
      if (positions > room)
        throw std::runtime_error(drafter.record().label() + ": draft_propose_topk returned " + std::to_string(positions) +
                                 " positions, more than the " + std::to_string(room) + " asked for");
      PositionCandidates candidates;
      const int64_t k = tokens_cpu.size(1);
      const int64_t* tokens_at = tokens_cpu.data_ptr<int64_t>();
      const float* log_probs_at = log_probs_cpu.data_ptr<float>();
      for (int64_t d = 0; d < positions; ++d) {
        candidates.tokens.emplace_back(tokens_at + d * k, tokens_at + (d + 1) * k);
        candidates.log_probs.emplace_back(log_probs_at + d * k, log_probs_at + (d + 1) * k);
      }
      temper(candidates, verification.tree_temperature);
      const DraftTree tree = build_draft_tree(candidates, verification.tree_nodes);
      std::vector<int64_t> fed = {next}, parents = {-1};
      for (int64_t i = 0; i < tree.size(); ++i) {
        fed.push_back(tree.tokens[static_cast<size_t>(i)]);
        parents.push_back(tree.parents[static_cast<size_t>(i)] + 1);  // node 0 is the newest token
      }
      out = phases.time(&DecodeProfile::target,
                        [&] { return target.decode_verify_tree(session, ids_tensor(fed), parents, layer_ids, true); });
      ++g.target_passes;
      std::vector<int64_t> path = {0}, fresh;
      phases.time(&DecodeProfile::accept, [&] {
        const std::vector<int64_t> choice = values_of(output(out, "logits", target.record()).argmax(-1).to(at::kCPU));
        if (static_cast<int64_t>(choice.size()) != tree.size() + 1)
          throw std::runtime_error(target.record().label() + ": decode_verify_tree returned " + std::to_string(choice.size()) +
                                   " rows of logits for " + std::to_string(tree.size() + 1) + " nodes");
        for (int64_t node : accepted_path(tree, choice)) {
          path.push_back(node + 1);
          fresh.push_back(tree.tokens[static_cast<size_t>(node)]);
        }
        fresh.push_back(choice[static_cast<size_t>(path.back())]);  // the bonus: the target's own next token
        target.decode_accept_path(session, path);
      });
      std::vector<int64_t> accepted_ids = {next};
      accepted_ids.insert(accepted_ids.end(), fresh.begin(), fresh.end() - 1);
      extend_drafter(out, accepted_ids, path);
      const size_t before = g.tokens.size();
      const bool done = emit(g, fresh, prompt.size(), limits);
      g.step_tokens.push_back(static_cast<int64_t>(g.tokens.size() - before));
      g.step_proposed.push_back(tree.size() == 0 ? 0 : *std::max_element(tree.depths.begin(), tree.depths.end()));
      g.step_accepted.push_back(static_cast<int64_t>(path.size()) - 1);
      if (done) break;
      next = fresh.back();
      next_on_device = ids_tensor({next});
      continue;
    }
    // The proposals, wherever the drafter computed them (their count is known without reading them).
    const at::Tensor proposal = room > 0 ? phases.time(&DecodeProfile::propose, [&] {
      return drafter.draft_propose(draft, {{"last_token", ids_tensor({next})}}, room).reshape({-1});
    }) : at::empty({0}, at::kLong);
    const int64_t proposed = proposal.numel();
    if (proposed > room)
      throw std::runtime_error(drafter.record().label() + ": draft_propose returned " + std::to_string(proposed) +
                               " tokens, more than the " + std::to_string(room) + " asked for");
    // The block to verify: the newest token and the proposals. Proposals on a
    // device are verified there, after the newest token's device copy; the
    // host reads them back with the target's choices.
    const bool on_device = proposed > 0 && !proposal.device().is_cpu();
    std::vector<int64_t> proposal_values = on_device ? std::vector<int64_t>{} : values_of(proposal);
    std::vector<int64_t> fed = {next};
    at::Tensor fed_tensor;
    if (on_device) {
      fed_tensor = at::cat({next_on_device, proposal.to(next_on_device.device(), at::kLong)});
    } else {
      fed.insert(fed.end(), proposal_values.begin(), proposal_values.end());
      fed_tensor = ids_tensor(fed);
    }
    const int64_t cached = static_cast<int64_t>(prompt.size()) + produced - 1;  // the cache before this pass
    out = phases.time(&DecodeProfile::target, [&] { return target.decode_extend(session, fed_tensor, layer_ids, true); });
    ++g.target_passes;
    // The step's one wait: the target's choices (with device proposals) read back together.
    at::Tensor choices_on_device;
    std::vector<int64_t> choice;
    size_t accepted = 0;
    phases.time(&DecodeProfile::accept, [&] {
      choices_on_device = output(out, "logits", target.record()).argmax(-1);
      if (on_device) {
        const std::vector<int64_t> back =
            values_of(at::cat({proposal.to(choices_on_device.device(), at::kLong), choices_on_device}).to(at::kCPU));
        proposal_values.assign(back.begin(), back.begin() + proposed);
        choice.assign(back.begin() + proposed, back.end());
        fed.insert(fed.end(), proposal_values.begin(), proposal_values.end());
      } else {
        choice = values_of(choices_on_device.to(at::kCPU));
      }
      while (accepted < proposal_values.size() && proposal_values[accepted] == choice[accepted]) ++accepted;
      // Keep `next` and the accepted proposals; the rest of the pass is dropped.
      target.decode_truncate(session, cached + 1 + static_cast<int64_t>(accepted));
    });
    extend_drafter(out, std::vector<int64_t>(fed.begin(), fed.begin() + 1 + static_cast<int64_t>(accepted)));
    std::vector<int64_t> fresh(proposal_values.begin(), proposal_values.begin() + static_cast<int64_t>(accepted));
    fresh.push_back(choice[accepted]);  // the bonus: the target's own next token
    const size_t before = g.tokens.size();
    const bool done = emit(g, fresh, prompt.size(), limits);
    g.step_tokens.push_back(static_cast<int64_t>(g.tokens.size() - before));
    g.step_proposed.push_back(proposed);
    g.step_accepted.push_back(static_cast<int64_t>(accepted));
    if (done) break;
    next = fresh.back();
    next_on_device = choices_on_device.narrow(0, static_cast<int64_t>(accepted), 1);
  }
  return finish();
}

}  // namespace dflash::eval
