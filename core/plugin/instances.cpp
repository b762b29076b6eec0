#include "plugin/instances.h"

#include "plugin/plugin_kind.h"

#include <ATen/ATen.h>

namespace dflash::host {
namespace {

nlohmann::json parse_plugin_json(const char* text, const PluginRecord& record, const char* call) {
  try {
    return nlohmann::json::parse(text ? text : "null");
  } catch (const nlohmann::json::exception& e) {
    throw PluginCallError(DFLASH_ERR_INTERNAL, record.label() + ": " + call + " returned invalid JSON: " + e.what());
  }
}

const dflash_tensor* handle_or_null(const at::Tensor& tensor, std::vector<TensorHandle>& keep) {
  if (!tensor.defined()) return nullptr;
  keep.emplace_back(new_handle(tensor));
  return keep.back().get();
}

}  // namespace

PluginInstance::PluginInstance(const PluginRecord& record, const nlohmann::json& config, const InstanceOptions& options)
    : record_(record) {
  const std::string config_json = config.dump();
  dflash_create_args args{};
  args.struct_size = sizeof(args);
  args.config_json = config_json.c_str();
  args.device = options.device.c_str();
  args.dtype = options.dtype.c_str();
  args.seed = options.seed;
  dflash_instance* made = nullptr;
  dflash_error* error = nullptr;
  {
    // create runs the plugin's constructor: if it crashes, say whose it was.
    const PluginCrashGuard guard("creating " + record_.label());
    error = record_.descriptor->create(host_api(), &args, &made);
  }
  if (error != nullptr) {
    ErrorPtr owned(error);
    throw PluginCallError(error->code, record_.label() + " failed to create (" + error_code_name(error->code) +
                                           "): " + error->message);
  }
  if (made == nullptr)
    throw PluginCallError(DFLASH_ERR_INTERNAL, record_.label() + " failed to create: create returned no instance and no error");
  self_ = made;
}

PluginInstance::~PluginInstance() {
  if (self_ != nullptr) record_.descriptor->destroy(self_);
}

void PluginInstance::check(dflash_error* error, const char* call) const {
  if (error == nullptr) return;
  ErrorPtr owned(error);
  throw PluginCallError(error->code, record_.label() + ": " + call + " failed (" + error_code_name(error->code) +
                                         "): " + error->message);
}

// --- memory planning ---
PluginMemoryPlan plan_memory(const PluginRecord& record, const nlohmann::json& config, const InstanceOptions& options,
                             const nlohmann::json& context) {
  PluginMemoryPlan result;
  const void* table = record.descriptor->vtable;
  const size_t table_size = *static_cast<const size_t*>(table);
  dflash_plan_memory_fn fn = nullptr;
  switch (record.kind) {
    case DFLASH_KIND_DATA_SOURCE:
      if (table_size >= DFLASH_SIZE_THROUGH(dflash_data_source_vtable, plan_memory))
        fn = static_cast<const dflash_data_source_vtable*>(table)->plan_memory;
      break;
    case DFLASH_KIND_TARGET_MODEL:
      if (table_size >= DFLASH_SIZE_THROUGH(dflash_target_vtable, plan_memory))
        fn = static_cast<const dflash_target_vtable*>(table)->plan_memory;
      break;
    case DFLASH_KIND_DRAFTER:
      if (table_size >= DFLASH_SIZE_THROUGH(dflash_drafter_vtable, plan_memory))
        fn = static_cast<const dflash_drafter_vtable*>(table)->plan_memory;
      break;
    default:
      break;
  }
  if (fn == nullptr) return result;
  const std::string config_json = config.dump(), context_json = context.dump();
  dflash_plan_request request{sizeof(dflash_plan_request), config_json.c_str(), options.device.c_str(),
                              options.dtype.c_str(), context_json.c_str()};
  dflash_memory_plan plan;
  if (dflash_error* error = fn(host_api(), &request, &plan)) {
    ErrorPtr owned(error);
    throw PluginCallError(error->code, record.label() + ": plan_memory failed (" + error_code_name(error->code) +
                                           "): " + error->message);
  }
  result.available = true;
  result.items = std::move(plan.items);
  result.facts = nlohmann::json::parse(plan.facts_json);
  return result;
}

// --- loss ---
LossOutput LossInstance::compute(const LossCall& call) const {
  std::vector<TensorHandle> keep;
  dflash_loss_inputs in{};
  in.struct_size = sizeof(in);
  in.hidden = handle_or_null(call.hidden, keep);
  in.lm_head_weight = handle_or_null(call.lm_head_weight, keep);
  in.targets = handle_or_null(call.targets, keep);
  in.ignore_index = call.ignore_index;
  in.row_weights = handle_or_null(call.row_weights, keep);
  in.teacher_kind = call.teacher;
  in.teacher_hidden = handle_or_null(call.teacher_hidden, keep);
  in.teacher_topk_ids = handle_or_null(call.teacher_topk_ids, keep);
  in.teacher_topk_logprobs = handle_or_null(call.teacher_topk_logprobs, keep);
  if (call.teacher_lm_head_weight.defined() && !reads_teacher_head())
    throw PluginCallError(DFLASH_ERR_INVALID_ARGUMENT, teacher_head_refusal());
  in.teacher_lm_head_weight = handle_or_null(call.teacher_lm_head_weight, keep);
  dflash_tensor_map metrics;
  dflash_loss_outputs out{};
  out.struct_size = sizeof(out);
  out.metrics = &metrics;
  check(table<dflash_loss_vtable>().compute(self(), &in, &out), "compute");
  TensorHandle loss(out.loss);
  if (!loss || !loss->tensor.defined() || loss->tensor.dim() != 0)
    throw PluginCallError(DFLASH_ERR_INTERNAL, record().label() + ": compute returned no 0-dim loss tensor");
  return {loss->tensor, from_map(metrics)};
}

bool LossInstance::reads_teacher_head() const { return record().abi_major == 1 && record().abi_minor >= 6; }

std::string LossInstance::teacher_head_refusal() const {
  return record().label() + " was built against plugin ABI " + std::to_string(record().abi_major) + "." +
         std::to_string(record().abi_minor) +
         ", which has no teacher head of its own (ABI 1.6): it would score the teacher through the drafter's head. "
         "Rebuild the loss against this SDK, or train with train.teacher = \"none\"";
}

std::optional<LossMemoryEstimate> LossInstance::estimate_memory(const dflash_loss_shape& shape) const {
  const auto& vtable = table<dflash_loss_vtable>();
  if (vtable.estimate_memory == nullptr) return std::nullopt;
  dflash_memory_estimate out{};
  out.struct_size = sizeof(out);
  check(vtable.estimate_memory(self(), &shape, &out), "estimate_memory");
  return LossMemoryEstimate{out.peak_bytes, out.saved_for_backward_bytes};
}

// --- scheduler ---
double SchedulerInstance::lr_at(int64_t step, int64_t total_steps, double base_lr) const {
  dflash_schedule_point point{sizeof(dflash_schedule_point), step, total_steps, base_lr};
  double lr = 0;
  check(table<dflash_scheduler_vtable>().lr_at(self(), &point, &lr), "lr_at");
  return lr;
}
bool SchedulerInstance::has_state() const { return table<dflash_scheduler_vtable>().save_state != nullptr; }
std::string SchedulerInstance::save_state() const {
  if (!has_state()) return "null";
  const char* json = nullptr;
  check(table<dflash_scheduler_vtable>().save_state(self(), &json), "save_state");
  return json ? json : "null";
}
void SchedulerInstance::load_state(const std::string& state_json) const {
  if (!has_state()) return;
  check(table<dflash_scheduler_vtable>().load_state(self(), state_json.c_str()), "load_state");
}

// --- data source ---
std::optional<NamedTensors> DataSourceInstance::next_batch() const {
  dflash_tensor_map batch;
  int32_t end = 0;
  check(table<dflash_data_source_vtable>().next_batch(self(), &batch, &end), "next_batch");
  if (end != 0) return std::nullopt;
  return from_map(batch);
}
std::string DataSourceInstance::save_state() const {
  const char* json = nullptr;
  check(table<dflash_data_source_vtable>().save_state(self(), &json), "save_state");
  if (json == nullptr) throw PluginCallError(DFLASH_ERR_INTERNAL, record().label() + ": save_state returned no JSON");
  return json;
}
void DataSourceInstance::load_state(const std::string& state_json) const {
  check(table<dflash_data_source_vtable>().load_state(self(), state_json.c_str()), "load_state");
}
std::optional<nlohmann::json> DataSourceInstance::describe() const {
  const auto& vtable = table<dflash_data_source_vtable>();
  if (vtable.describe == nullptr) return std::nullopt;
  const char* json = nullptr;
  check(vtable.describe(self(), &json), "describe");
  return parse_plugin_json(json, record(), "describe");
}

// --- target model ---
nlohmann::json TargetModelInstance::describe() const {
  const char* json = nullptr;
  check(table<dflash_target_vtable>().describe(self(), &json), "describe");
  return parse_plugin_json(json, record(), "describe");
}
NamedTensors TargetModelInstance::forward(const NamedTensors& batch, const std::vector<int64_t>& layer_ids,
                                          bool want_last_hidden, bool want_logits) const {
  auto batch_map = to_map(batch);
  dflash_target_request request{};
  request.struct_size = sizeof(request);
  request.batch = batch_map.get();
  request.layer_ids = layer_ids.data();
  request.layer_count = layer_ids.size();
  request.want_last_hidden = want_last_hidden;
  request.want_logits = want_logits;
  dflash_tensor_map out;
  check(table<dflash_target_vtable>().forward(self(), &request, &out), "forward");
  return from_map(out);
}
NamedTensors TargetModelInstance::frozen_weights() const {
  dflash_tensor_map out;
  check(table<dflash_target_vtable>().frozen_weights(self(), &out), "frozen_weights");
  return from_map(out);
}

bool TargetModelInstance::can_decode() const {
  const auto& vtable = table<dflash_target_vtable>();
  return DFLASH_HAS_FIELD(dflash_target_vtable, &vtable, decode_end) && vtable.decode_begin != nullptr;
}
namespace {
void require(bool supported, const PluginRecord& record, const char* what) {
  if (!supported)
    throw PluginCallError(DFLASH_ERR_UNIMPLEMENTED, record.label() + " does not implement " + what +
                                                      " (ABI 1.1's optional slots); use a plugin that does");
}
}  // namespace
int64_t TargetModelInstance::decode_begin(int64_t max_length) const {
  require(can_decode(), record(), "incremental decoding");
  int64_t session = -1;
  check(table<dflash_target_vtable>().decode_begin(self(), max_length, &session), "decode_begin");
  return session;
}
NamedTensors TargetModelInstance::decode_extend(int64_t session, const at::Tensor& tokens,
                                                const std::vector<int64_t>& layer_ids, bool want_logits) const {
  require(can_decode(), record(), "incremental decoding");
  const TensorHandle token_handle(new_handle(tokens));
  dflash_target_decode_request request{};
  request.struct_size = sizeof(request);
  request.tokens = token_handle.get();
  request.layer_ids = layer_ids.data();
  request.layer_count = layer_ids.size();
  request.want_logits = want_logits;
  dflash_tensor_map out;
  check(table<dflash_target_vtable>().decode_extend(self(), session, &request, &out), "decode_extend");
  return from_map(out);
}
void TargetModelInstance::decode_truncate(int64_t session, int64_t length) const {
  require(can_decode(), record(), "incremental decoding");
  check(table<dflash_target_vtable>().decode_truncate(self(), session, length), "decode_truncate");
}
void TargetModelInstance::decode_end(int64_t session) const noexcept {
  if (can_decode()) table<dflash_target_vtable>().decode_end(self(), session);
}
bool TargetModelInstance::can_decode_batch() const {
  const auto& vtable = table<dflash_target_vtable>();
  return can_decode() && DFLASH_HAS_FIELD(dflash_target_vtable, &vtable, decode_extend_batch) &&
         vtable.decode_extend_batch != nullptr;
}
namespace {
// What a target without decode_extend_batch gives for the batch: one
// decode_extend per session, each row's outputs stacked as the slot would.
NamedTensors extend_one_by_one(const TargetModelInstance& target, const std::vector<int64_t>& sessions, const at::Tensor& tokens,
                               const std::vector<int64_t>& layer_ids, LogitRows logits) {
  std::vector<NamedTensors> rows;
  for (size_t i = 0; i < sessions.size(); ++i)
    rows.push_back(target.decode_extend(sessions[i], tokens[static_cast<int64_t>(i)], layer_ids, logits != LogitRows::kNone));
  NamedTensors out;
  for (const auto& [name, first] : rows.front()) {
    std::vector<at::Tensor> parts;
    for (const NamedTensors& row : rows) {
      at::Tensor part = require_tensor(row, name, target.record().label() + ": decode_extend");
      if (name == "logits" && logits == LogitRows::kLast) part = part.narrow(0, part.size(0) - 1, 1);
      parts.push_back(part);
    }
    out.emplace_back(name, at::stack(parts));
  }
  return out;
}
}  // namespace
NamedTensors TargetModelInstance::decode_extend_batch(const std::vector<int64_t>& sessions, const at::Tensor& tokens,
                                                      const std::vector<int64_t>& layer_ids, LogitRows logits) const {
  require(can_decode(), record(), "incremental decoding");
  if (sessions.empty() || tokens.dim() != 2 || tokens.size(0) != static_cast<int64_t>(sessions.size()) || tokens.size(1) < 1)
    throw std::invalid_argument("decode_extend_batch: tokens must be [sessions, n] with n >= 1; got " + c10::str(tokens.sizes()) +
                                " for " + std::to_string(sessions.size()) + " sessions");
  if (!can_decode_batch()) return extend_one_by_one(*this, sessions, tokens, layer_ids, logits);
  const TensorHandle token_handle(new_handle(tokens));
  dflash_target_batch_decode_request request{};
  request.struct_size = sizeof(request);
  request.sessions = sessions.data();
  request.count = sessions.size();
  request.tokens = token_handle.get();
  request.layer_ids = layer_ids.data();
  request.layer_count = layer_ids.size();
  request.logits = static_cast<int32_t>(logits);
  dflash_tensor_map out;
  check(table<dflash_target_vtable>().decode_extend_batch(self(), &request, &out), "decode_extend_batch");
  return from_map(out);
}

bool TargetModelInstance::can_verify_tree() const {
  const auto& vtable = table<dflash_target_vtable>();
  return can_decode() && DFLASH_HAS_FIELD(dflash_target_vtable, &vtable, decode_accept_path) &&
         vtable.decode_verify_tree != nullptr;
}
NamedTensors TargetModelInstance::decode_verify_tree(int64_t session, const at::Tensor& tokens, const std::vector<int64_t>& parents,
                                                     const std::vector<int64_t>& layer_ids, bool want_logits) const {
  if (!can_verify_tree())
    throw PluginCallError(DFLASH_ERR_UNIMPLEMENTED, record().label() +
                                                      " does not verify draft trees (ABI 1.4's decode_verify_tree); use "
                                                      "--verify chain, or a target that does");
  if (tokens.dim() != 1 || tokens.size(0) < 1 || tokens.size(0) != static_cast<int64_t>(parents.size()))
    throw std::invalid_argument("decode_verify_tree: tokens must be [n] with n >= 1 and one parent each; got " +
                                c10::str(tokens.sizes()) + " and " + std::to_string(parents.size()) + " parents");
  const TensorHandle token_handle(new_handle(tokens));
  dflash_target_tree_request request{};
  request.struct_size = sizeof(request);
  request.tokens = token_handle.get();
  request.parents = parents.data();
  request.count = parents.size();
  request.layer_ids = layer_ids.data();
  request.layer_count = layer_ids.size();
  request.want_logits = want_logits;
  dflash_tensor_map out;
  check(table<dflash_target_vtable>().decode_verify_tree(self(), session, &request, &out), "decode_verify_tree");
  return from_map(out);
}
void TargetModelInstance::decode_accept_path(int64_t session, const std::vector<int64_t>& path) const {
  if (!can_verify_tree())
    throw PluginCallError(DFLASH_ERR_UNIMPLEMENTED, record().label() + " does not verify draft trees (ABI 1.4)");
  check(table<dflash_target_vtable>().decode_accept_path(self(), session, path.data(), path.size()), "decode_accept_path");
}

// --- drafter ---
bool DrafterInstance::can_draft() const {
  const auto& vtable = table<dflash_drafter_vtable>();
  return DFLASH_HAS_FIELD(dflash_drafter_vtable, &vtable, draft_end) && vtable.draft_begin != nullptr;
}
int64_t DrafterInstance::draft_begin() const {
  require(can_draft(), record(), "speculative drafting");
  int64_t session = -1;
  check(table<dflash_drafter_vtable>().draft_begin(self(), &session), "draft_begin");
  return session;
}
void DrafterInstance::draft_extend(int64_t session, const NamedTensors& inputs) const {
  require(can_draft(), record(), "speculative drafting");
  auto in = to_map(inputs);
  check(table<dflash_drafter_vtable>().draft_extend(self(), session, in.get()), "draft_extend");
}
at::Tensor DrafterInstance::draft_propose(int64_t session, const NamedTensors& inputs, int64_t count) const {
  require(can_draft(), record(), "speculative drafting");
  auto in = to_map(inputs);
  dflash_tensor_map out;
  check(table<dflash_drafter_vtable>().draft_propose(self(), session, in.get(), count, &out), "draft_propose");
  const at::Tensor tokens = find_tensor(from_map(out), "tokens");
  if (!tokens.defined()) throw PluginCallError(DFLASH_ERR_INTERNAL, record().label() + ": draft_propose returned no 'tokens'");
  return tokens;
}
void DrafterInstance::draft_end(int64_t session) const noexcept {
  if (can_draft()) table<dflash_drafter_vtable>().draft_end(self(), session);
}
bool DrafterInstance::can_draft_topk() const {
  const auto& vtable = table<dflash_drafter_vtable>();
  return can_draft() && DFLASH_HAS_FIELD(dflash_drafter_vtable, &vtable, draft_propose_topk) &&
         vtable.draft_propose_topk != nullptr;
}
DrafterInstance::TopK DrafterInstance::draft_propose_topk(int64_t session, const NamedTensors& inputs, int64_t count,
                                                          int64_t k) const {
  if (!can_draft_topk())
    throw PluginCallError(DFLASH_ERR_UNIMPLEMENTED, record().label() +
                                                      " does not propose a tree's candidates (ABI 1.4's draft_propose_topk); "
                                                      "use --verify chain, or a drafter that does");
  auto in = to_map(inputs);
  dflash_tensor_map out;
  check(table<dflash_drafter_vtable>().draft_propose_topk(self(), session, in.get(), count, k, &out), "draft_propose_topk");
  const NamedTensors got = from_map(out);
  TopK topk{find_tensor(got, "tokens"), find_tensor(got, "log_probs")};
  const std::string who = record().label() + ": draft_propose_topk";
  if (!topk.tokens.defined() || !topk.log_probs.defined())
    throw PluginCallError(DFLASH_ERR_INTERNAL, who + " returned no 'tokens' or no 'log_probs'");
  if (topk.tokens.dim() != 2 || topk.tokens.sizes() != topk.log_probs.sizes() || topk.tokens.size(0) > count ||
      (topk.tokens.size(0) > 0 && topk.tokens.size(1) != k) || topk.tokens.scalar_type() != at::kLong ||
      !at::isFloatingType(topk.log_probs.scalar_type()))
    throw PluginCallError(DFLASH_ERR_INTERNAL, who + " returned tokens " + c10::str(topk.tokens.sizes()) + " " +
                                                   c10::toString(topk.tokens.scalar_type()) + " and log_probs " +
                                                   c10::str(topk.log_probs.sizes()) + " " +
                                                   c10::toString(topk.log_probs.scalar_type()) + "; expected [m, " +
                                                   std::to_string(k) + "] int64 and float each, m ≤ " + std::to_string(count));
  return topk;
}

NamedTensors DrafterInstance::parameters() const {
  dflash_tensor_map out;
  check(table<dflash_drafter_vtable>().parameters(self(), &out), "parameters");
  return from_map(out);
}
void DrafterInstance::bind_target(const nlohmann::json& target, const NamedTensors& frozen_weights) const {
  auto frozen = to_map(frozen_weights);
  const std::string json = target.dump();
  check(table<dflash_drafter_vtable>().bind_target(self(), json.c_str(), frozen.get()), "bind_target");
}
NamedTensors DrafterInstance::forward(const NamedTensors& inputs) const {
  auto in = to_map(inputs);
  dflash_tensor_map out;
  check(table<dflash_drafter_vtable>().forward(self(), in.get(), &out), "forward");
  return from_map(out);
}
std::optional<nlohmann::json> DrafterInstance::export_config() const {
  const auto& vtable = table<dflash_drafter_vtable>();
  if (vtable.export_config == nullptr) return std::nullopt;
  const char* json = nullptr;
  check(vtable.export_config(self(), &json), "export_config");
  return parse_plugin_json(json, record(), "export_config");
}
std::optional<DrafterInstance::LossHeads> DrafterInstance::loss_heads() const {
  const auto& vtable = table<dflash_drafter_vtable>();
  if (!DFLASH_HAS_FIELD(dflash_drafter_vtable, &vtable, loss_heads) || vtable.loss_heads == nullptr) return std::nullopt;
  dflash_tensor_map out;
  check(vtable.loss_heads(self(), &out), "loss_heads");
  const NamedTensors heads = from_map(out);
  const std::string who = record().label() + ": loss_heads";
  LossHeads result;
  for (const auto& [name, tensor] : heads) {
    if (name == "lm_head") result.lm_head = tensor;
    else if (name == "teacher_lm_head") result.teacher_lm_head = tensor;
    else throw PluginCallError(DFLASH_ERR_INTERNAL, who + " returned '" + name + "'; it may return lm_head and teacher_lm_head only");
  }
  if (!result.lm_head.defined() || result.lm_head.dim() != 2)
    throw PluginCallError(DFLASH_ERR_INTERNAL, who + " returned no lm_head [V_d, H]");
  if (!result.lm_head.requires_grad())
    throw PluginCallError(DFLASH_ERR_INTERNAL, who + ": lm_head does not require grad; it must be the drafter's own "
                                                     "trainable head, the same leaf as among its parameters");
  const at::Tensor& t = result.teacher_lm_head;
  if (t.defined() && (t.dim() != 2 || t.size(0) != result.lm_head.size(0) || t.requires_grad()))
    throw PluginCallError(DFLASH_ERR_INTERNAL, who + ": teacher_lm_head must be a frozen [" +
                                                   std::to_string(result.lm_head.size(0)) + ", H_t] (lm_head's V_d rows), got " +
                                                   c10::str(t.sizes()) + (t.requires_grad() ? " requiring grad" : ""));
  return result;
}

NamedTensors DrafterInstance::buffers() const {
  const auto& vtable = table<dflash_drafter_vtable>();
  if (!DFLASH_HAS_FIELD(dflash_drafter_vtable, &vtable, buffers) || vtable.buffers == nullptr) return {};
  dflash_tensor_map out;
  check(vtable.buffers(self(), &out), "buffers");
  NamedTensors result = from_map(out);
  for (const auto& [name, tensor] : result)
    if (tensor.requires_grad())
      throw PluginCallError(DFLASH_ERR_INTERNAL, record().label() + ": buffers returned '" + name +
                                                     "', which requires grad; trained tensors belong in parameters");
  return result;
}

std::optional<nlohmann::json> DrafterInstance::checkpoint_match() const {
  const auto& vtable = table<dflash_drafter_vtable>();
  if (!DFLASH_HAS_FIELD(dflash_drafter_vtable, &vtable, checkpoint_match) || vtable.checkpoint_match == nullptr)
    return std::nullopt;
  const char* json = nullptr;
  check(vtable.checkpoint_match(self(), &json), "checkpoint_match");
  nlohmann::json match = parse_plugin_json(json, record(), "checkpoint_match");
  const std::string who = record().label() + ": checkpoint_match";
  auto bad = [&](const std::string& what) {
    return PluginCallError(DFLASH_ERR_INTERNAL, who + " returned " + match.dump() + "; " + what);
  };
  if (!match.is_object()) throw bad("expected an object {\"drafter\": [keys], \"target\": {key: fact}}");
  for (const auto& [section, value] : match.items()) {
    if (section == "drafter") {
      if (!value.is_array()) throw bad("\"drafter\" must be a list of config.json keys");
      for (const auto& key : value)
        if (!key.is_string()) throw bad("\"drafter\" holds " + key.dump() + ", not a key");
    } else if (section == "target") {
      if (!value.is_object()) throw bad("\"target\" must map config.json keys to the target's describe facts");
      for (const auto& [key, fact] : value.items())
        if (!fact.is_string()) throw bad("\"target\"." + key + " is " + fact.dump() + ", not a fact's name");
    } else {
      throw bad("unknown section \"" + section + "\" (drafter, target)");
    }
  }
  return match;
}
void DrafterInstance::set_training(bool training) const {
  const auto& vtable = table<dflash_drafter_vtable>();
  if (vtable.set_training != nullptr) check(vtable.set_training(self(), training ? 1 : 0), "set_training");
}

}  // namespace dflash::host
