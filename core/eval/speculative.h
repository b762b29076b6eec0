// Greedy decoding with a target alone, and lossless speculative decoding with
// a drafter: the drafter proposes up to block_size − 1 tokens after the newest
// one, one target pass verifies them, the longest prefix equal to the
// target's own greedy choices is kept, plus the target's next token (the
// bonus). Both use the target's KV cache (decode_* slots) and the drafter's
// cached context (draft_* slots); nothing is recomputed from scratch.
#pragma once

#include "eval/verification.h"
#include "plugin/instances.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dflash::eval {

// The smallest block speculative decoding verifies: the newest token and one
// proposal. (Training takes any block_size ≥ 1, the slots a drafter
// predicts; a drafter's own schema may ask for more, e.g. dflash's 2..256.)
constexpr int64_t kMinDecodeBlockSize = 2;

struct DecodeLimits {
  int64_t max_new_tokens = 128;  // tokens generated per prompt at most
  int64_t max_length = 0;        // prompt + generated at most (the KV cache's size)
  std::vector<int64_t> eos_token_ids;  // generation stops after emitting one of these
};

struct Generation {
  std::vector<int64_t> tokens;      // generated tokens (an end-of-sequence token included)
  std::string stop_reason;          // "eos", "max_new_tokens" or "max_length"
  int64_t target_passes = 0;        // decode_extend calls, the prefill included
  // Speculative only: per verification step, the tokens it added (accepted
  // proposals + the bonus), and how many proposals it was offered.
  std::vector<int64_t> step_tokens, step_proposed, step_accepted;
  double seconds = 0;               // wall time, prefill included
};

// Where a decoding's wall time goes (bench/decode_bench.cpp). Each phase ends
// with `sync`, a wait for the device, so a phase is charged the device work it
// queued; those waits slow the decoding down a little, so per-token figures
// come from runs without a profile. Phases add up over calls.
struct DecodeProfile {
  std::function<void()> sync;  // waits for the device; may be empty (the CPU)
  double target = 0;    // the target's passes: prefill, generation, verification (decode_extend)
  double propose = 0;   // draft_propose
  double extend = 0;    // draft_extend: the drafter's context grows by the accepted tokens
  double accept = 0;    // the greedy choices read back and compared on the host, the cache truncated
  double other = 0;     // the rest: sessions begun and ended, the tokens emitted, the host's bookkeeping
  int64_t steps = 0;    // target passes after the prefill
  int64_t tokens = 0;   // tokens generated
};

// Throws std::invalid_argument when nothing can be generated after `prompt`:
// it is empty, or not shorter than max_length.
void check_prompt(const std::vector<int64_t>& prompt, const DecodeLimits& limits);
// Why generation ends after its `generated`-th token `token` (prompt_length
// tokens before it): "eos", "max_new_tokens", "max_length", or nullptr to go on.
// The one stopping rule of eval's decodings and of generate.
const char* stop_reason(int64_t token, int64_t generated, int64_t prompt_length, const DecodeLimits& limits);
// The tokens a session needs for a prompt: prompt + max_new_tokens, at most max_length.
int64_t session_capacity(int64_t prompt_length, const DecodeLimits& limits);

// The target's own greedy continuation of `prompt` [P] (int64).
//
// Both decodings wait for the device once per step: to read back the
// target's greedy choices (argmax on the device; with a drafter on the
// device, its proposals in the same copy). Everything else stays where the
// plugins put it: the newest token goes back to the target as a view of that
// argmax, and a drafter's proposals are verified where they lie. Tokens
// handed to decode_extend may thus be on the target's device (ABI: "CPU or
// the model's device"); draft_extend's input_ids and draft_propose's
// last_token are always on the CPU, where the host has them anyway.
Generation greedy_decode(const host::TargetModelInstance& target, const std::vector<int64_t>& prompt,
                         const DecodeLimits& limits, DecodeProfile* profile = nullptr);

// The same tokens, produced `block_size − 1` proposals at a time. layer_ids:
// the target layers the drafter reads (its export_config's target_layer_ids).
// With a tree, step_proposed is the tree's depth (the block positions it
// offers) and step_accepted the accepted path's length.
Generation speculative_decode(const host::TargetModelInstance& target, const host::DrafterInstance& drafter,
                              const std::vector<int64_t>& prompt, const DecodeLimits& limits, int64_t block_size,
                              const std::vector<int64_t>& layer_ids, DecodeProfile* profile = nullptr,
                              const Verification& verification = {});

}  // namespace dflash::eval
