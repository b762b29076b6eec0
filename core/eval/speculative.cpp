#include "eval/speculative.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>

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

// The target's greedy choice after each of the rows of logits [n, V].
std::vector<int64_t> greedy_choices(const at::Tensor& logits) {
  const at::Tensor best = logits.argmax(-1).to(at::kCPU, at::kLong).contiguous();
  return {best.data_ptr<int64_t>(), best.data_ptr<int64_t>() + best.numel()};
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

Generation greedy_decode(const host::TargetModelInstance& target, const std::vector<int64_t>& prompt,
                         const DecodeLimits& limits) {
  check_prompt(prompt, limits);
  const auto start = Clock::now();
  Generation g;
  const int64_t session = target.decode_begin(capacity(prompt, limits));
  const SessionGuard guard{[&] { target.decode_end(session); }};
  at::Tensor logits = output(target.decode_extend(session, ids_tensor(prompt), {}, true), "logits", target.record());
  ++g.target_passes;
  while (true) {
    const int64_t next = greedy_choices(logits.narrow(0, logits.size(0) - 1, 1)).front();
    if (emit(g, {next}, prompt.size(), limits)) break;
    logits = output(target.decode_extend(session, ids_tensor({next}), {}, true), "logits", target.record());
    ++g.target_passes;
  }
  g.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return g;
}

Generation speculative_decode(const host::TargetModelInstance& target, const host::DrafterInstance& drafter,
                              const std::vector<int64_t>& prompt, const DecodeLimits& limits, int64_t block_size,
                              const std::vector<int64_t>& layer_ids) {
  check_prompt(prompt, limits);
  if (block_size < 2) throw std::invalid_argument("block_size must be at least 2 (the newest token + one proposal)");
  const auto start = Clock::now();
  Generation g;
  const int64_t session = target.decode_begin(capacity(prompt, limits));
  const SessionGuard target_guard{[&] { target.decode_end(session); }};
  const int64_t draft = drafter.draft_begin();
  const SessionGuard draft_guard{[&] { drafter.draft_end(draft); }};

  // The drafter's context: accepted tokens with the target's features at them.
  auto extend_drafter = [&](const host::NamedTensors& out, const std::vector<int64_t>& accepted) {
    host::NamedTensors inputs = {{"input_ids", ids_tensor(accepted)}};
    const auto rows = static_cast<int64_t>(accepted.size());
    for (int64_t id : layer_ids) {
      const std::string name = "hidden." + std::to_string(id);
      inputs.emplace_back(name, output(out, name, target.record()).narrow(0, 0, rows));
    }
    drafter.draft_extend(draft, inputs);
  };

  host::NamedTensors out = target.decode_extend(session, ids_tensor(prompt), layer_ids, true);
  ++g.target_passes;
  const at::Tensor prefill_logits = output(out, "logits", target.record());
  int64_t next = greedy_choices(prefill_logits.narrow(0, prefill_logits.size(0) - 1, 1)).front();
  extend_drafter(out, prompt);
  if (emit(g, {next}, prompt.size(), limits)) {
    g.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return g;
  }
  while (true) {
    // `next` is the newest token: generated, not yet in the target's cache.
    const int64_t produced = static_cast<int64_t>(g.tokens.size());
    int64_t room = std::min<int64_t>(block_size - 1, limits.max_new_tokens - produced - 1);
    if (limits.max_length > 0) room = std::min<int64_t>(room, limits.max_length - static_cast<int64_t>(prompt.size()) - produced);
    room = std::max<int64_t>(room, 0);
    const at::Tensor proposal_tensor = room > 0 ? drafter.draft_propose(draft, {{"last_token", ids_tensor({next})}}, room)
                                                : at::empty({0}, at::kLong);
    const at::Tensor proposal_cpu = proposal_tensor.reshape({-1}).to(at::kCPU, at::kLong).contiguous();
    std::vector<int64_t> proposal(proposal_cpu.data_ptr<int64_t>(), proposal_cpu.data_ptr<int64_t>() + proposal_cpu.numel());
    if (static_cast<int64_t>(proposal.size()) > room)
      throw std::runtime_error(drafter.record().label() + ": draft_propose returned " + std::to_string(proposal.size()) +
                               " tokens, more than the " + std::to_string(room) + " asked for");
    std::vector<int64_t> fed = {next};
    fed.insert(fed.end(), proposal.begin(), proposal.end());
    const int64_t cached = static_cast<int64_t>(prompt.size()) + produced - 1;  // the cache before this pass
    out = target.decode_extend(session, ids_tensor(fed), layer_ids, true);
    ++g.target_passes;
    const std::vector<int64_t> choice = greedy_choices(output(out, "logits", target.record()));
    size_t accepted = 0;
    while (accepted < proposal.size() && proposal[accepted] == choice[accepted]) ++accepted;
    // Keep `next` and the accepted proposals; the rest of the pass is dropped.
    target.decode_truncate(session, cached + 1 + static_cast<int64_t>(accepted));
    extend_drafter(out, std::vector<int64_t>(fed.begin(), fed.begin() + 1 + static_cast<int64_t>(accepted)));
    std::vector<int64_t> fresh(proposal.begin(), proposal.begin() + static_cast<int64_t>(accepted));
    fresh.push_back(choice[accepted]);  // the bonus: the target's own next token
    const size_t before = g.tokens.size();
    const bool done = emit(g, fresh, prompt.size(), limits);
    g.step_tokens.push_back(static_cast<int64_t>(g.tokens.size() - before));
    g.step_proposed.push_back(static_cast<int64_t>(proposal.size()));
    g.step_accepted.push_back(static_cast<int64_t>(accepted));
    if (done) break;
    next = fresh.back();
  }
  g.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return g;
}

}  // namespace dflash::eval
