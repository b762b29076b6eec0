#include "memory/memory_plan.h"
#include "memory/memory_stats.h"


#include "plugin/plugin_kind.h"

#include <dflash/sdk/torch.hpp>
#include <dflash/sdk/torch_compat.hpp>

#include <algorithm>
#include <functional>
#include <optional>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <stdexcept>

#if DFLASH_HOST_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <dlfcn.h>
#endif

namespace dflash::memory {
namespace {

constexpr unsigned kPhases[4] = {kTargetForward, kLossForward, kBackward, kOptimizer};

unsigned phases_of(int32_t plugin_phase) {
  switch (plugin_phase) {
    case DFLASH_MEMORY_TARGET_FORWARD: return kTargetForward;
    case DFLASH_MEMORY_ACTIVATIONS: return kLossForward | kBackward;
    case DFLASH_MEMORY_BACKWARD: return kBackward;
    default: return kEveryPhase;
  }
}

std::string when(unsigned phases) {
  if (phases == kEveryPhase) return "resident";
  std::string out;
  for (unsigned bit : kPhases)
    if (phases & bit) out += (out.empty() ? "" : ", ") + std::string(phase_name(bit));
  return out;
}

// A plugin's number as int64, saturated: a uint64 above INT64_MAX, or a
// double outside int64 (converting one is undefined), becomes the bound.
int64_t saturated_int(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() > uint64_t{INT64_MAX} ? INT64_MAX : v.get<int64_t>();
  if (v.is_number_integer()) return v.get<int64_t>();
  const double d = v.get<double>();
  if (!(d < 9223372036854775808.0)) return d > 0 ? INT64_MAX : 0;  // also NaN
  return d < -9223372036854775808.0 ? INT64_MIN : static_cast<int64_t>(d);
}

// A byte count whose arithmetic cannot wrap: a product or sum beyond int64
// saturates at kTooManyBytes and stays "too many" through what follows, so a
// figure is either exact or known to overflow. An expression must start
// from a Bytes for its products to be checked: Bytes(rows) * row_length * e.
struct Bytes {
  int64_t value = 0;
  bool too_many = false;
  Bytes(int64_t v = 0) : value(v) {}  // NOLINT: implicit, so plain counts mix in
  static Bytes saturated() {
    Bytes b(kTooManyBytes);
    b.too_many = true;
    return b;
  }
  static Bytes of_plugin(uint64_t v) { return v > uint64_t{INT64_MAX} ? saturated() : Bytes(static_cast<int64_t>(v)); }
};

Bytes operator*(Bytes a, Bytes b) {
  int64_t r = 0;
  if (a.too_many || b.too_many || __builtin_mul_overflow(a.value, b.value, &r)) return Bytes::saturated();
  return Bytes(r);
}

Bytes operator+(Bytes a, Bytes b) {
  int64_t r = 0;
  if (a.too_many || b.too_many || __builtin_add_overflow(a.value, b.value, &r)) return Bytes::saturated();
  return Bytes(r);
}

}  // namespace

int64_t element_bytes(const std::string& dtype) { return static_cast<int64_t>(c10::elementSize(sdk::parse_dtype(dtype))); }

// Rounded, and saturated at kTooManyBytes (llround of 2^63 or more is undefined).
int64_t as_bytes(double v) {
  if (!(v > 0)) return 0;
  return v >= 9223372036854775808.0 ? kTooManyBytes : static_cast<int64_t>(std::llround(v));
}

int64_t fact(const nlohmann::json& facts, const char* key, int64_t fallback) {
  auto it = facts.find(key);
  return it != facts.end() && it->is_number() ? saturated_int(*it) : fallback;
}

const char* phase_name(unsigned bit) {
  switch (bit) {
    case kTargetForward: return "target forward";
    case kLossForward: return "drafter forward + loss";
    case kBackward: return "drafter backward";
    case kOptimizer: return "optimizer step";
    default: return "every phase";
  }
}

int64_t DevicePlan::bytes_of(const std::string& prefix) const {
  int64_t total = 0;
  for (const PlanLine& line : lines)
    if (line.category.rfind(prefix, 0) == 0) total += line.bytes;
  return total;
}

const char* role_name(PlanRole role) {
  switch (role) {
    case PlanRole::kTargetRank: return "target rank";
    case PlanRole::kDrafterRank: return "drafter rank";
    default: return "target and drafter";
  }
}

DevicePlan compute_plan(const PlanInputs& in) {
  DevicePlan plan;
  plan.role = in.role;
  const bool holds_target = in.role != PlanRole::kDrafterRank, holds_drafter = in.role != PlanRole::kTargetRank;
  plan.device = in.device;
  plan.dtype = in.dtype;
  plan.world_size = std::max<int64_t>(1, in.world_size);
  plan.slack_fraction = in.slack_fraction;
  const int64_t e = element_bytes(in.dtype);
  auto add = [&](std::string category, std::string source, Bytes bytes, unsigned phases, std::string note = "") {
    if (bytes.too_many) plan.overflowed.push_back(category);
    plan.lines.push_back({std::move(category), std::move(source), bytes.value, phases, std::move(note)});
  };
  auto add_items = [&](const host::PluginMemoryPlan& p, const std::string& label) {
    for (const auto& item : p.items) add(item.category, label, Bytes::of_plugin(item.bytes), phases_of(item.phase));
  };
  if (!in.data.available) plan.missing.push_back(in.data_label + " does not report its batch shape (no plan_memory)");
  if (!in.target.available) plan.missing.push_back(in.target_label + " does not estimate its memory (no plan_memory)");
  if (!in.drafter.available) plan.missing.push_back(in.drafter_label + " does not estimate its memory (no plan_memory)");
  if (!in.loss) plan.missing.push_back(in.loss_label + " does not estimate its memory (no estimate_memory)");

  const int64_t rows = fact(in.data.facts, "rows"), row_length = fact(in.data.facts, "row_length");
  const Bytes tokens = Bytes(rows) * row_length;
  const int64_t hidden = fact(in.target.facts, "hidden_size"), vocab = fact(in.target.facts, "vocab_size");
  plan.facts["rows"] = rows;
  plan.facts["row_length"] = row_length;
  // Config values a plugin rounds, as it really uses them (by section).
  plan.facts["effective"] = {{"data", in.data.facts.value("effective", nlohmann::json::object())}};

  // The target. Its plugin's own facts (its architecture, what decoding
  // keeps per session and per token) go with a plan that holds it.
  if (holds_target) {
    add_items(in.target, in.target_label);
    plan.facts["target"] = in.target.facts;
  }
  // cuBLAS's workspace for each stream that runs GEMMs, kept from first use:
  // the training stream's, and those of the streams the target's forward
  // runs on besides it (its fact forward_streams).
  if (in.gemm_workspace_bytes > 0) {
    add("cuBLAS workspace of the training stream", "host", in.gemm_workspace_bytes, kEveryPhase);
    const int64_t target_streams = holds_target ? fact(in.target.facts, "forward_streams", 0) : 0;
    if (target_streams > 0)
      add("cuBLAS workspaces of the target forward's " + std::to_string(target_streams) + " streams", in.target_label,
          Bytes(target_streams) * in.gemm_workspace_bytes, kEveryPhase);
  }
  // The frozen verifier weights on the drafter's device: the host's copies
  // alias the target's own where device and dtype agree (one device here).
  // A drafter rank received its own copy from target rank 0.
  const std::string target_dtype = in.target.facts.value("weights_dtype", in.dtype);
  if (in.target.available && holds_drafter) {
    const char* frozen = "frozen verifier weights (embed_tokens, lm_head, final_norm)";
    const Bytes copy = (Bytes(in.target.facts.value("tied_embeddings", false) ? 1 : 2) * vocab * hidden + hidden) * e;
    if (in.role == PlanRole::kDrafterRank) add(frozen, "host", copy, kEveryPhase, "received from target rank 0");
    else if (target_dtype == in.dtype) add(frozen, "host", 0, kEveryPhase, "shared with the target's weights: same device and dtype");
    else add(frozen, "host", copy, kEveryPhase, "copied from the target's " + target_dtype);
    // A drafter's teacher head (ABI 1.6): the target's lm_head rows of its
    // vocabulary, a copy the drafter holds beside its own head.
    const int64_t teacher_hidden = fact(in.drafter.facts, "teacher_hidden", 0);
    if (teacher_hidden > 0)
      add("the drafter's teacher head (the target's lm_head rows of its vocabulary)", in.drafter_label,
          Bytes(fact(in.drafter.facts, "loss_vocab", vocab)) * teacher_hidden * e, kEveryPhase);
  }

  // The drafter's parameters and what the host keeps for them (a target rank has none).
  const int64_t parameters = holds_drafter ? fact(in.drafter.facts, "parameters") : 0;
  const int64_t largest = fact(in.drafter.facts, "largest_parameter", parameters);
  const int64_t state_bytes = in.fp32_master ? 4 : e;
  if (holds_drafter) {
    add("drafter weights", in.drafter_label, Bytes(parameters) * e, kEveryPhase);
    // Gradients are dropped after every update and arrive during backward (the
    // drafter's backward item counts the share alive at its peak); with
    // accumulation they stay from the first micro-batch on.
    // A rank of a data-parallel run accumulates its share of the global batch.
    const int64_t world = std::max<int64_t>(1, in.world_size);
    const int64_t micro_batches_here = (in.grad_accumulation + world - 1) / world;
    add("drafter gradients", "host", Bytes(parameters) * e, micro_batches_here > 1 ? kEveryPhase : kOptimizer);
    // ZeRO-1: a rank keeps the optimizer state of about 1/N of the parameters.
    const bool sharded = in.shard_optimizer && world > 1;
    const int64_t owned = sharded ? (parameters + world - 1) / world + largest : parameters;
    const std::string share = sharded ? "its share under shard_optimizer, ≤ 1/" + std::to_string(world) + " + the largest tensor" : "";
    add("AdamW states (exp_avg, exp_avg_sq)", "host", Bytes(2) * std::min(owned, parameters) * state_bytes, kEveryPhase, share);
    if (in.fp32_master) add("fp32 master weights", "host", Bytes(std::min(owned, parameters)) * 4, kEveryPhase, share);
    // The gradient buckets the ranks all-reduce: one flat copy of the gradients
    // in the reduction dtype, from the backward on.
    if (world > 1)
      add("gradient buckets (all-reduce across ranks)", "host", Bytes(parameters) * state_bytes, kBackward | kOptimizer,
          in.fp32_master ? "fp32 (fp32_master)" : "the parameters' dtype");
    Bytes optimizer_working = 0;
    if (in.fused_adamw)
      optimizer_working = in.fp32_master ? Bytes(std::min(parameters, (Bytes(int64_t{256} << 20) + largest).value)) * 4 : 0;
    else
      optimizer_working = Bytes(5) * largest * 4;  // the per-tensor loop's fp32 temporaries
    add("optimizer working memory", "host", optimizer_working, kOptimizer,
        in.fused_adamw ? (in.fp32_master ? "fused AdamW, gradients cast to fp32 in 256 M-element batches" : "fused AdamW")
                       : "per-tensor loop");
    add_items(in.drafter, in.drafter_label);
  }

  // The micro-batch on the device and the target's outputs, the hidden-state
  // item. Colocated: one in flight (the trainer runs the target and the
  // drafter one after the other). A target rank: the one its forward makes,
  // held until a drafter rank grants it a slot. A drafter rank: at most
  // train.queue_depth, granted, queued or trained on, in every phase.
  const auto& layer_ids = in.drafter.facts.contains("target_layer_ids") ? in.drafter.facts.at("target_layer_ids")
                                                                       : nlohmann::json::array();
  const int64_t feature_tensors = static_cast<int64_t>(layer_ids.size()) + (in.teacher ? 1 : 0);
  const Bytes item = Bytes(feature_tensors) * tokens * hidden * e;
  plan.item_bytes = item.value;
  const std::string item_shape = std::to_string(feature_tensors) + " × [" + std::to_string(rows) + ", " +
                                 std::to_string(row_length) + ", " + std::to_string(hidden) + "]";
  add("batch on the device (ids, masks, positions, documents)", "host", Bytes(4 * 8) * tokens,
      in.role == PlanRole::kTargetRank ? kTargetForward : in.role == PlanRole::kDrafterRank ? kLossForward
                                                                                            : kTargetForward | kLossForward);
  if (in.role == PlanRole::kDrafterRank)
    add("hidden-state items queued: " + std::to_string(in.queue_depth) + " × " + item_shape, "host",
        Bytes(in.queue_depth) * item.value, kEveryPhase, "train.queue_depth items, whatever the number of target ranks");
  else
    add("hidden-state items in flight: 1 × " + item_shape, "host", item,
        in.role == PlanRole::kTargetRank ? kTargetForward : kTargetForward | kLossForward,
        in.role == PlanRole::kTargetRank ? "the item its forward makes, held until a drafter rank grants a slot" : "");

  // The loss at the drafter's rows.
  if (in.loss && holds_drafter) {
    const Bytes saved = Bytes::of_plugin(in.loss->saved_for_backward_bytes);
    const Bytes peak = Bytes::of_plugin(in.loss->peak_bytes);
    add("loss: kept for backward", in.loss_label, saved, kLossForward | kBackward);
    add("loss: working memory at its peak", in.loss_label,
        peak.too_many ? peak : Bytes(std::max<int64_t>(0, peak.value - saved.value)), kLossForward);
  }
  plan.facts["loss_rows"] = fact(in.drafter.facts, "loss_rows");
  plan.facts["block_tokens"] = fact(in.drafter.facts, "block_tokens");
  plan.facts["drafter_parameters"] = parameters;

  // A saturated line saturates its phases and the total: they are named
  // only when they overflow on their own (lines that each fit).
  for (int i = 0; i < 4; ++i) {
    Bytes phase = 0;
    for (const PlanLine& line : plan.lines)
      if (line.phases & kPhases[i]) phase = phase + (line.bytes == kTooManyBytes ? Bytes::saturated() : Bytes(line.bytes));
    plan.phase_bytes[i] = phase.value;
    if (phase.too_many && plan.representable()) plan.overflowed.push_back(std::string("phase ") + phase_name(kPhases[i]));
  }
  for (int i = 0; i < 4; ++i)
    if (plan.phase_bytes[i] > plan.peak_bytes) plan.peak_bytes = plan.phase_bytes[i], plan.peak_phase = kPhases[i];
  plan.slack_bytes = plan.peak_bytes == kTooManyBytes ? kTooManyBytes
                                                     : as_bytes(static_cast<double>(plan.peak_bytes) * in.slack_fraction);
  const Bytes total = (plan.peak_bytes == kTooManyBytes ? Bytes::saturated() : Bytes(plan.peak_bytes)) +
                      (plan.slack_bytes == kTooManyBytes ? Bytes::saturated() : Bytes(plan.slack_bytes));
  if (total.too_many && plan.representable()) plan.overflowed.push_back("total (peak + slack)");
  plan.total_bytes = total.value;
  return plan;
}

std::string format_loss_alone(const LossAlonePlan& p) {
  std::ostringstream out;
  const double share =
      p.full_logits_bytes > 0 ? static_cast<double>(p.estimate.peak_bytes) / static_cast<double>(p.full_logits_bytes) : 0.0;
  out << "memory plan of " << p.loss_label << " alone: " << p.rows << " rows, vocabulary " << p.vocab << ", hidden "
      << p.hidden << ", " << p.dtype << " on " << p.device << ", teacher " << (p.teacher ? "hidden states" : "none")
      << "\n\n"
      << "  working memory at its peak (compute and backward)  " << format_bytes(static_cast<int64_t>(p.estimate.peak_bytes))
      << "\n"
      << "  kept from compute for backward                     "
      << format_bytes(static_cast<int64_t>(p.estimate.saved_for_backward_bytes)) << "\n"
      << "  the full [rows, V] logits, for comparison          " << format_bytes(p.full_logits_bytes) << " (the peak is "
      << std::fixed << std::setprecision(3) << share << "× of them)\n";
  return out.str();
}

nlohmann::json loss_alone_to_json(const LossAlonePlan& p) {
  return {{"loss", p.loss_label},
          {"device", p.device},
          {"dtype", p.dtype},
          {"rows", p.rows},
          {"vocab", p.vocab},
          {"hidden", p.hidden},
          {"teacher", p.teacher},
          {"peak_bytes", p.estimate.peak_bytes},
          {"saved_for_backward_bytes", p.estimate.saved_for_backward_bytes},
          {"full_logits_bytes", p.full_logits_bytes}};
}

void require_device(const std::string& device_text) {
  const c10::Device device(device_text);
  if (!device.is_cuda()) return;
#if DFLASH_HOST_CUDA
  const int count = c10::cuda::device_count();
  if ((device.has_index() ? device.index() : 0) >= count)
    throw std::runtime_error("train.device \"" + device_text + "\": this machine has " + std::to_string(count) +
                             " CUDA device" + (count == 1 ? "" : "s") +
                             (count == 0 ? "; set train.device=cpu" : "; use cuda:0 to cuda:" + std::to_string(count - 1)) +
                             " (or, only to plan for a card, `dflash-host plan --gpu-memory SIZE`)");
#else
  throw std::runtime_error("train.device \"" + device_text + "\": this dflash-host was built without CUDA, so it "
                           "cannot run on or query a CUDA device; set train.device=cpu (or, only to plan for a "
                           "card, `dflash-host plan --gpu-memory SIZE`)");
#endif
}

Capacity device_capacity(const std::string& device_text) {
  Capacity c;
  const c10::Device device(device_text);
  require_device(device_text);
#if DFLASH_HOST_CUDA
  if (device.is_cuda()) {
    // The CUDA runtime LibTorch loaded, found at run time: the host links
    // LibTorch's CUDA libraries, not the runtime itself.
    using MemGetInfo = int (*)(size_t*, size_t*);
    auto mem_get_info = reinterpret_cast<MemGetInfo>(dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
    if (mem_get_info == nullptr)
      throw std::runtime_error("cannot find the CUDA runtime's cudaMemGetInfo to query " + device.str() +
                               "; give the capacity with --gpu-memory");
    const c10::DeviceIndex previous = c10::cuda::current_device();
    c10::cuda::set_device(device.has_index() ? device.index() : 0);
    size_t free_bytes = 0, total_bytes = 0;
    const int status = mem_get_info(&free_bytes, &total_bytes);
    c10::cuda::set_device(previous);
    if (status != 0)
      throw std::runtime_error("cannot query " + device.str() + "'s memory (CUDA error " + std::to_string(status) +
                               "); give the capacity with --gpu-memory");
    c.total_bytes = static_cast<int64_t>(total_bytes);
    c.free_bytes = static_cast<int64_t>(free_bytes);
    c.source = "CUDA driver, free now";
    return c;
  }
#endif
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemTotal:") c.total_bytes = value * 1024;
    if (key == "MemAvailable:") c.free_bytes = value * 1024;
  }
  c.source = "/proc/meminfo MemAvailable";
  return c;
}

int64_t parse_size(const std::string& text) {
  std::string s;
  for (char ch : text)
    if (!std::isspace(static_cast<unsigned char>(ch))) s += ch;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char ch) { return std::tolower(ch); });
  static const std::map<std::string, double> units{
      {"", 1},           {"b", 1},          {"kib", 1024.0},   {"mib", 1048576.0}, {"gib", 1073741824.0},
      {"tib", 1099511627776.0}, {"kb", 1e3}, {"mb", 1e6},       {"gb", 1e9},        {"tb", 1e12},
      {"k", 1024.0},     {"m", 1048576.0},  {"g", 1073741824.0}, {"t", 1099511627776.0}};
  auto it = units.find(unit);
  if (used == 0 || it == units.end() || !(value > 0))
    throw std::invalid_argument("'" + text + "' is not a memory size; write it like 96GiB, 80GB, 512MiB or a byte count");
  return as_bytes(value * it->second);
}

std::string format_bytes(int64_t bytes) {
  if (bytes == kTooManyBytes) return "more than 8 EiB (overflow)";
  std::ostringstream out;
  const double b = static_cast<double>(bytes);
  if (std::llabs(bytes) >= (int64_t{1} << 30)) out << std::fixed << std::setprecision(2) << b / 1073741824.0 << " GiB";
  else if (std::llabs(bytes) >= (int64_t{1} << 20)) out << std::fixed << std::setprecision(1) << b / 1048576.0 << " MiB";
  else if (std::llabs(bytes) >= 1024) out << std::fixed << std::setprecision(1) << b / 1024.0 << " KiB";
  else out << bytes << " B";
  return out.str();
}

std::string Suggestion::override_flag() const { return "--set " + section + "." + key + "=" + std::to_string(value); }

std::string format_plan(const DevicePlan& plan, const Capacity& capacity, const std::optional<Verdict>& verdict) {
  std::ostringstream out;
  size_t width = 40;
  for (const PlanLine& line : plan.lines) width = std::max(width, line.category.size());
  width = std::min<size_t>(width, 72);
  size_t bytes_width = 11;  // wider for "more than 8 EiB (overflow)"
  for (const PlanLine& line : plan.lines) bytes_width = std::max(bytes_width, format_bytes(line.bytes).size());
  out << "memory plan for " << plan.device << " (" << role_name(plan.role) << "), " << plan.dtype
      << (plan.world_size > 1 ? std::string(", one ") + (plan.role == PlanRole::kDrafterRank ? "drafter rank" : "rank") +
                                    " of " + std::to_string(plan.world_size)
                              : std::string())
      << "; batch "
      << plan.facts.value("rows", int64_t{0}) << " × " << plan.facts.value("row_length", int64_t{0}) << " tokens, "
      << plan.facts.value("block_tokens", int64_t{0}) << " block tokens, " << plan.facts.value("loss_rows", int64_t{0})
      << " loss rows\n\n";
  out << "  " << std::left << std::setw(static_cast<int>(width)) << "category" << "  " << std::right
      << std::setw(static_cast<int>(bytes_width)) << "bytes" << "  " << std::left << std::setw(24) << "source" << "when\n";
  for (const PlanLine& line : plan.lines) {
    out << "  " << std::left << std::setw(static_cast<int>(width)) << line.category << "  " << std::right
        << std::setw(static_cast<int>(bytes_width)) << format_bytes(line.bytes) << "  " << std::left << std::setw(24) << line.source << when(line.phases);
    if (!line.note.empty()) out << " (" << line.note << ")";
    out << "\n";
  }
  out << "\n  by phase:";
  for (int i = 0; i < 4; ++i)
    out << (i ? "; " : " ") << phase_name(kPhases[i]) << " " << format_bytes(plan.phase_bytes[i]);
  out << "\n";
  out << "  predicted peak: " << format_bytes(plan.peak_bytes) << " (" << phase_name(plan.peak_phase) << ")\n";
  out << "  allocator slack (" << std::fixed << std::setprecision(0) << plan.slack_fraction * 100
      << " % of the peak, train.memory_slack): " << format_bytes(plan.slack_bytes) << "\n";
  out << "  total: " << format_bytes(plan.total_bytes) << "\n";
  if (!plan.representable()) {
    out << "  overflow: ";
    for (size_t i = 0; i < plan.overflowed.size(); ++i) out << (i ? "; " : "") << plan.overflowed[i];
    out << " exceed" << (plan.overflowed.size() == 1 ? "s" : "")
        << " 2^63 bytes, beyond any device: a setting is far too large (a batch of tokens, a model dimension); lower it\n";
  }
  for (const std::string& m : plan.missing) out << "  not estimated: " << m << "\n";
  if (capacity.total_bytes > 0 || capacity.free_bytes > 0)
    out << "  device: " << format_bytes(capacity.free_bytes) << " available of " << format_bytes(capacity.total_bytes)
        << " (" << capacity.source << ")\n";
  if (verdict) {
    if (!plan.complete()) {
      out << "\n  verdict: unknown — the plan is incomplete (see 'not estimated' above)\n";
    } else if (verdict->fits) {
      out << "\n  verdict: fits, " << format_bytes(verdict->available_bytes - plan.total_bytes) << " to spare\n";
    } else {
      if (plan.representable())
        out << "\n  verdict: does NOT fit: needs " << format_bytes(plan.total_bytes) << ", "
            << format_bytes(verdict->available_bytes) << " available, short by " << format_bytes(verdict->short_by) << "\n";
      else
        out << "\n  verdict: does NOT fit: needs more than any device has (see 'overflow' above), "
            << format_bytes(verdict->available_bytes) << " available\n";
      if (verdict->suggestions.empty()) {
        out << "  no single memory knob makes it fit; lower several, turn on activation checkpointing, or use a larger device\n";
      } else {
        out << "  largest settings that fit, each alone (everything else unchanged):\n";
        for (const Suggestion& s : verdict->suggestions)
          out << "    " << std::left << std::setw(44) << s.override_flag() << " " << s.label << ", now " << s.current << "\n";
      }
    }
  }
  return out.str();
}

nlohmann::json plan_to_json(const DevicePlan& plan, const Capacity& capacity, const std::optional<Verdict>& verdict) {
  nlohmann::json lines = nlohmann::json::array();
  for (const PlanLine& line : plan.lines)
    lines.push_back({{"category", line.category}, {"source", line.source}, {"bytes", line.bytes}, {"when", when(line.phases)},
                     {"note", line.note}});
  nlohmann::json phases = nlohmann::json::object();
  for (int i = 0; i < 4; ++i) phases[phase_name(kPhases[i])] = plan.phase_bytes[i];
  nlohmann::json out{{"device", plan.device},
                     {"dtype", plan.dtype},
                     {"world_size", plan.world_size},
                     {"role", role_name(plan.role)},
                     {"item_bytes", plan.item_bytes},
                     {"lines", lines},
                     {"phases", phases},
                     {"peak_bytes", plan.peak_bytes},
                     {"peak_phase", phase_name(plan.peak_phase)},
                     {"slack_bytes", plan.slack_bytes},
                     {"total_bytes", plan.total_bytes},
                     {"missing", plan.missing},
                     {"overflowed", plan.overflowed},
                     {"facts", plan.facts},
                     {"capacity", {{"total_bytes", capacity.total_bytes}, {"free_bytes", capacity.free_bytes}, {"source", capacity.source}}}};
  if (verdict) {
    nlohmann::json suggestions = nlohmann::json::array();
    for (const Suggestion& s : verdict->suggestions)
      suggestions.push_back({{"section", s.section}, {"key", s.key}, {"label", s.label}, {"current", s.current},
                             {"value", s.value}, {"set", s.override_flag()}});
    out["verdict"] = {{"fits", verdict->fits}, {"available_bytes", verdict->available_bytes}, {"short_by", verdict->short_by},
                      {"suggestions", suggestions}};
  }
  return out;
}

}  // namespace dflash::memory
