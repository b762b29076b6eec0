#include "generate/generation.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>

namespace dflash::generate {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// One prompt being answered: its session, what it has generated so far, and
// the newest token, chosen but not yet in the target's cache.
struct Sequence {
  size_t prompt_index = 0;
  int64_t session = -1;
  int64_t prompt_length = 0;
  std::vector<int64_t> tokens;
  int64_t pending = -1;
  PromptRandom random;
  std::string stop_reason;  // set when it is finished
};

at::Tensor ids_tensor(const std::vector<int64_t>& ids, int64_t rows) {
  at::Tensor out = at::empty({static_cast<int64_t>(ids.size())}, at::kLong);
  std::copy(ids.begin(), ids.end(), out.data_ptr<int64_t>());
  return out.view({rows, -1});
}

// The logits [rows, 1, V] a pass returned for each sequence's newest token, as [rows, V].
at::Tensor last_logits(const host::NamedTensors& out, const host::TargetModelInstance& target, int64_t rows) {
  const at::Tensor logits = host::require_tensor(out, "logits", target.record().label() + ": decode_extend_batch");
  if (logits.dim() != 3 || logits.size(0) != rows || logits.size(1) != 1)
    throw std::runtime_error(target.record().label() + ": decode_extend_batch returned logits of shape " +
                             c10::str(logits.sizes()) + " for " + std::to_string(rows) +
                             " sequences and the last position; expected [" + std::to_string(rows) + ", 1, V]");
  return logits.select(1, 0);
}

// The sequences' next tokens from their logits [rows, V]; each draws from its own stream.
std::vector<int64_t> choose(const at::Tensor& logits, const std::vector<Sequence*>& rows, const Sampling& sampling) {
  std::vector<double> draws;
  if (!sampling.greedy())
    for (Sequence* s : rows) draws.push_back(s->random.next());
  return choose_tokens(logits, sampling, draws);
}

// Appends a chosen token; sets stop_reason when it ends the answer (eval's rule).
void take(Sequence& s, int64_t token, const eval::DecodeLimits& limits) {
  s.tokens.push_back(token);
  s.pending = token;
  if (const char* reason = eval::stop_reason(token, static_cast<int64_t>(s.tokens.size()), s.prompt_length, limits))
    s.stop_reason = reason;
}

// The batch: up to batch_size slots. A finished sequence's slot takes the next
// prompt, so a slot keeps its place (and, in a pooled target cache, likely its
// row) across replacements.
class Batch {
 public:
  Batch(const host::TargetModelInstance& target, const std::vector<eval::Prompt>& prompts, const GenerateSettings& settings,
        const std::function<void(Answer&&)>& on_answer, GenerateStats& stats)
      : target_(target), prompts_(prompts), settings_(settings), on_answer_(on_answer), stats_(stats),
        slots_(static_cast<size_t>(settings.batch_size)) {
    // One capacity for every session: a target that pools its caches (as
    // hf_decoder does) then never has to grow a row.
    int64_t longest = 0;
    for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));
    capacity_ = eval::session_capacity(longest, settings.limits);
  }
  ~Batch() {
    for (auto& slot : slots_)
      if (slot) target_.decode_end(slot->session);
  }

  // Fills empty slots with the next prompts until the batch is full or the
  // prompts run out; a prompt answered by its prefill alone frees its slot again.
  // (The prompts were checked before: none is empty or too long.)
  void admit() {
    while (next_ < prompts_.size() && occupied() < slots_.size()) {
      // Sessions first, in slot order, then the prefills: a pooled cache
      // grows while every new row is still empty, and rows follow slots.
      std::vector<size_t> fresh;
      for (size_t i = 0; i < slots_.size() && next_ < prompts_.size(); ++i) {
        if (slots_[i]) continue;
        slots_[i].emplace(Sequence{next_, target_.decode_begin(capacity_), static_cast<int64_t>(prompts_[next_].ids.size()), {}, -1,
                                   PromptRandom(settings_.sampling.seed, next_), {}});
        fresh.push_back(i);
        ++next_;
      }
      for (size_t i : fresh) prefill(i);
    }
  }

  // One pass for every sequence in the batch: each newest token in, each next token out.
  void step() {
    std::vector<Sequence*> rows;
    std::vector<int64_t> sessions, tokens;
    for (auto& slot : slots_)
      if (slot) {
        rows.push_back(&*slot);
        sessions.push_back(slot->session);
        tokens.push_back(slot->pending);
      }
    const auto count = static_cast<int64_t>(rows.size());
    const host::NamedTensors out =
        target_.decode_extend_batch(sessions, ids_tensor(tokens, count), {}, host::LogitRows::kLast);
    const std::vector<int64_t> next = choose(last_logits(out, target_, count), rows, settings_.sampling);
    ++stats_.steps;
    stats_.step_rows += count;
    for (size_t r = 0; r < rows.size(); ++r) take(*rows[r], next[r], settings_.limits);
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i] && !slots_[i]->stop_reason.empty()) finish(i);
  }

  bool empty() const { return occupied() == 0; }

 private:
  size_t occupied() const {
    return static_cast<size_t>(std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s.has_value(); }));
  }

  void prefill(size_t slot) {
    Sequence& s = *slots_[slot];
    const std::vector<int64_t>& ids = prompts_[s.prompt_index].ids;
    const auto start = Clock::now();
    const host::NamedTensors out = target_.decode_extend_batch({s.session}, ids_tensor(ids, 1), {}, host::LogitRows::kLast);
    take(s, choose(last_logits(out, target_, 1), {&s}, settings_.sampling).front(), settings_.limits);
    stats_.prefill_seconds += seconds_since(start);
    ++stats_.prefills;
    stats_.prompt_tokens += static_cast<int64_t>(ids.size());
    if (!s.stop_reason.empty()) finish(slot);
  }

  void finish(size_t slot) {
    Sequence& s = *slots_[slot];
    target_.decode_end(s.session);
    stats_.generated_tokens += static_cast<int64_t>(s.tokens.size());
    ++stats_.prompts;
    Answer answer{s.prompt_index, std::move(s.tokens), std::move(s.stop_reason)};
    slots_[slot].reset();
    on_answer_(std::move(answer));
  }

  const host::TargetModelInstance& target_;
  const std::vector<eval::Prompt>& prompts_;
  const GenerateSettings& settings_;
  const std::function<void(Answer&&)>& on_answer_;
  GenerateStats& stats_;
  std::vector<std::optional<Sequence>> slots_;
  size_t next_ = 0;  // the next prompt to admit
  int64_t capacity_ = 0;
};

}  // namespace

GenerateStats generate(const host::TargetModelInstance& target, const std::vector<eval::Prompt>& prompts,
                       const std::string& prompts_file, const GenerateSettings& settings,
                       const std::function<void(Answer&&)>& on_answer) {
  if (!target.can_decode())
    throw std::invalid_argument(target.record().label() +
                                " cannot decode incrementally (no decode_* slots); generate needs a target that can");
  if (settings.batch_size < 1) throw std::invalid_argument("generate: the batch size must be at least 1");
  // Every prompt is checked before the first is generated for: a bad one
  // must not surface after hours of generation.
  for (const eval::Prompt& p : prompts) {
    try {
      eval::check_prompt(p.ids, settings.limits);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(prompts_file + ":" + std::to_string(p.line) + ": " + e.what());
    }
  }
  GenerateStats stats;
  stats.native_batch = target.can_decode_batch();
  const auto start = Clock::now();
  {
    Batch batch(target, prompts, settings, on_answer, stats);
    for (batch.admit(); !batch.empty(); batch.admit()) batch.step();
  }
  stats.seconds = seconds_since(start);
  return stats;
}

}  // namespace dflash::generate
