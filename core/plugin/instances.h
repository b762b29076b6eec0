// Host-side C++ wrappers over plugin instances: each call goes through the C
// vtable, and a returned error object becomes a PluginCallError whose message
// names the plugin, its file and the call.
#pragma once

#include "plugin/host_api.h"
#include "plugin/registry.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash::host {

class PluginCallError : public std::runtime_error {
 public:
  PluginCallError(int32_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int32_t code() const { return code_; }

 private:
  int32_t code_;
};

struct InstanceOptions {
  std::string device = "cpu";
  std::string dtype = "float32";
  uint64_t seed = 0;
};

class PluginInstance {
 public:
  // Calls the plugin's create with its (validated) config section.
  PluginInstance(const PluginRecord& record, const nlohmann::json& config, const InstanceOptions& options);
  virtual ~PluginInstance();
  PluginInstance(const PluginInstance&) = delete;
  PluginInstance& operator=(const PluginInstance&) = delete;

  const PluginRecord& record() const { return record_; }

 protected:
  template <class Table>
  const Table& table() const {
    return *static_cast<const Table*>(record_.descriptor->vtable);
  }
  // Throws PluginCallError for a non-NULL error, after freeing it.
  void check(dflash_error* error, const char* call) const;
  dflash_instance* self() const { return self_; }

 private:
  PluginRecord record_;
  dflash_instance* self_ = nullptr;
};

// --- memory planning (ABI 1.2), before any instance exists ---
struct PluginMemoryPlan {
  bool available = false;  // false: the plugin has no plan_memory (built before ABI 1.2, or chose not to)
  std::vector<dflash_memory_plan::Item> items;
  nlohmann::json facts = nlohmann::json::object();
};
// Calls the plugin's plan_memory with its (validated) config section and the
// host's context; throws PluginCallError naming the plugin when it fails.
PluginMemoryPlan plan_memory(const PluginRecord& record, const nlohmann::json& config, const InstanceOptions& options,
                             const nlohmann::json& context);

// --- loss ---
struct LossCall {
  at::Tensor hidden, lm_head_weight, targets;
  int64_t ignore_index = DFLASH_IGNORE_INDEX;  // what drafters write (dflash/abi.h)
  at::Tensor row_weights;  // undefined = all ones
  dflash_teacher_kind teacher = DFLASH_TEACHER_NONE;
  at::Tensor teacher_hidden, teacher_topk_ids, teacher_topk_logprobs;
  // (ABI 1.6) the teacher's own head [V, H_t]; undefined: lm_head_weight.
  at::Tensor teacher_lm_head_weight;
};
struct LossOutput {
  at::Tensor loss;
  NamedTensors metrics;
};
struct LossMemoryEstimate {
  uint64_t peak_bytes = 0;
  uint64_t saved_for_backward_bytes = 0;
};

class LossInstance : public PluginInstance {
 public:
  using PluginInstance::PluginInstance;
  LossOutput compute(const LossCall& call) const;
  // Whether the library reads a teacher head of its own (built against ABI
  // 1.6 or later): an older one would send the teacher through the student's
  // head without a word, so the host never hands it one.
  bool reads_teacher_head() const;
  // Why an older library is never handed one: the library, its ABI, what to do.
  std::string teacher_head_refusal() const;
  // nullopt when the plugin does not implement the optional slot.
  std::optional<LossMemoryEstimate> estimate_memory(const dflash_loss_shape& shape) const;
};

// --- scheduler ---
class SchedulerInstance : public PluginInstance {
 public:
  using PluginInstance::PluginInstance;
  double lr_at(int64_t step, int64_t total_steps, double base_lr) const;
  bool has_state() const;
  std::string save_state() const;  // "null" when stateless
  void load_state(const std::string& state_json) const;
};

// --- data source ---
class DataSourceInstance : public PluginInstance {
 public:
  using PluginInstance::PluginInstance;
  std::optional<NamedTensors> next_batch() const;  // nullopt at the end of the data
  std::string save_state() const;
  void load_state(const std::string& state_json) const;
  std::optional<nlohmann::json> describe() const;
};

// --- target model ---
// Which logits a batched decoding step returns (dflash_decode_logits).
enum class LogitRows : int32_t {
  kNone = DFLASH_DECODE_LOGITS_NONE,  // none
  kAll = DFLASH_DECODE_LOGITS_ALL,    // [count, n, V]
  kLast = DFLASH_DECODE_LOGITS_LAST   // [count, 1, V]: after each session's last new token
};

class TargetModelInstance : public PluginInstance {
 public:
  using PluginInstance::PluginInstance;
  nlohmann::json describe() const;
  NamedTensors forward(const NamedTensors& batch, const std::vector<int64_t>& layer_ids, bool want_last_hidden,
                       bool want_logits) const;
  NamedTensors frozen_weights() const;
  // Incremental decoding (ABI 1.1, optional): false when the plugin lacks it.
  bool can_decode() const;
  int64_t decode_begin(int64_t max_length) const;
  NamedTensors decode_extend(int64_t session, const at::Tensor& tokens, const std::vector<int64_t>& layer_ids,
                             bool want_logits) const;
  void decode_truncate(int64_t session, int64_t length) const;
  void decode_end(int64_t session) const noexcept;
  // Batched decoding (ABI 1.3, optional): whether the target has the slot.
  bool can_decode_batch() const;
  // tokens [count, n] int64: row i appended to sessions[i]; "hidden.<id>"
  // [count, n, H] and the logits asked for come back. A target without the
  // slot is called once per session (decode_extend) and the results stacked;
  // if one of those calls fails, the sessions before it have been extended.
  NamedTensors decode_extend_batch(const std::vector<int64_t>& sessions, const at::Tensor& tokens,
                                   const std::vector<int64_t>& layer_ids, LogitRows logits) const;
  // Tree verification (ABI 1.4, optional): whether the target has the pair.
  bool can_verify_tree() const;
  // tokens [n] int64, parents[i] in [−1, i): "hidden.<id>" [n, H] and, if
  // asked, "logits" [n, V], node i's rows as for its path alone. The tree is
  // pending until decode_accept_path keeps `path` (a chain from a child of
  // the last cached token) and drops the rest.
  NamedTensors decode_verify_tree(int64_t session, const at::Tensor& tokens, const std::vector<int64_t>& parents,
                                  const std::vector<int64_t>& layer_ids, bool want_logits) const;
  void decode_accept_path(int64_t session, const std::vector<int64_t>& path) const;
};

// --- drafter ---
class DrafterInstance : public PluginInstance {
 public:
  using PluginInstance::PluginInstance;
  NamedTensors parameters() const;
  void bind_target(const nlohmann::json& target, const NamedTensors& frozen_weights) const;
  NamedTensors forward(const NamedTensors& inputs) const;
  std::optional<nlohmann::json> export_config() const;
  // ABI 1.5's checkpoint_match: {"drafter": [keys], "target": {key: fact}},
  // checked here (a list of strings, an object of strings); nullopt when the
  // drafter does not say (then only its three facts are compared).
  std::optional<nlohmann::json> checkpoint_match() const;
  void set_training(bool training) const;  // no-op when the optional slot is absent
  // ABI 1.6's loss_heads: the drafter's own "lm_head" [V_d, H] (one of its
  // parameters) and, optionally, "teacher_lm_head" [V_d, H_t], checked;
  // nullopt when the drafter has none (the target's lm_head serves).
  struct LossHeads {
    at::Tensor lm_head, teacher_lm_head;
  };
  std::optional<LossHeads> loss_heads() const;
  // ABI 1.6's buffers: persistent tensors that are not trained, aliasing the
  // live ones; empty when the drafter has none.
  NamedTensors buffers() const;
  // Speculative decoding (ABI 1.1, optional): false when the plugin lacks it.
  bool can_draft() const;
  int64_t draft_begin() const;
  void draft_extend(int64_t session, const NamedTensors& inputs) const;
  at::Tensor draft_propose(int64_t session, const NamedTensors& inputs, int64_t count) const;
  void draft_end(int64_t session) const noexcept;
  // A tree's candidates (ABI 1.4, optional): the best k tokens at each of up
  // to `count` positions, [m, k] each, checked: tokens int64, log_probs
  // float, the same shape, m ≤ count.
  bool can_draft_topk() const;
  struct TopK {
    at::Tensor tokens, log_probs;
  };
  TopK draft_propose_topk(int64_t session, const NamedTensors& inputs, int64_t count, int64_t k) const;
};

}  // namespace dflash::host
