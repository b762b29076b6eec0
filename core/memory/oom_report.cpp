#include "memory/oom_report.h"

#include "plugin/instances.h"
#include "plugin/same_device.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <iomanip>
#include <new>
#include <set>
#include <sstream>

namespace dflash::memory {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "] " + std::string(c10::toString(t.scalar_type()));
}

const void* storage_key(const at::Tensor& t) { return t.storage().data_ptr().get(); }

}  // namespace

std::string short_oom_message(const std::string& message) {
  // LibTorch's CUDA message: keep "CUDA out of memory. Tried to allocate X."
  // and the capacity sentence, drop the advice paragraph.
  const size_t start = message.find("CUDA out of memory");
  if (start == std::string::npos) return message;
  const size_t tried = message.find("Tried to allocate", start);
  const size_t end = tried == std::string::npos ? std::string::npos : message.find(". ", tried);
  const size_t capacity = message.find("GPU ", start);
  const size_t capacity_end = capacity == std::string::npos ? std::string::npos : message.find(". ", capacity);
  std::string out = message.substr(start, end == std::string::npos ? std::string::npos : end - start);
  if (capacity_end != std::string::npos) out += "; " + message.substr(capacity, capacity_end - capacity);
  return out;
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  if (const auto* call = dynamic_cast<const host::PluginCallError*>(&e)) return call->code() == DFLASH_ERR_OUT_OF_MEMORY;
  return false;
}

int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t total = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (seen.insert(storage_key(t)).second) total += static_cast<int64_t>(t.storage().nbytes());
  }
  return total;
}

std::string format_oom_report(const OomEvent& event) {
  std::ostringstream out;
  out << "\n=== out of memory on " << event.device << " at step " << event.step << ", during the " << event.phase << " ===\n";
  out << "  error: " << short_oom_message(event.error) << "\n";
  out << "  allocator after the failed step unwound: " << format_bytes(event.figures.current_bytes) << " allocated";
  if (event.figures.reserved_bytes > 0) out << ", " << format_bytes(event.figures.reserved_bytes) << " reserved";
  out << "; peak this step " << format_bytes(event.figures.peak_bytes) << " (" << event.figures.source << ")\n";
  if (event.figures.source == "process_rss")
    out << "  (on the CPU the figures are the process's resident memory, libraries included: compare them with the\n"
           "   plan only roughly)\n";
  out << "\n";

  // Actual bytes per named group, each storage counted once overall.
  const c10::Device device(event.device);
  std::set<const void*> seen;
  struct Row {
    std::string category;
    int64_t predicted = -1, actual = 0;
    bool informational = false;
  };
  std::vector<Row> rows;
  std::vector<std::tuple<int64_t, std::string, std::string>> largest;  // bytes, name, category
  int64_t attributed = 0;
  for (const NamedGroup& group : event.groups) {
    Row row{group.category, -1, 0, group.part_of_remainder};
    for (const auto& [name, t] : group.tensors) {
      if (!t.defined() || !t.has_storage() || !host::same_device(t.device(), device)) continue;
      if (!seen.insert(storage_key(t)).second) continue;
      const auto bytes = static_cast<int64_t>(t.storage().nbytes());
      row.actual += bytes;
      largest.emplace_back(bytes, name + " " + shape_of(t), group.category);
    }
    if (!row.informational) attributed += row.actual;
    if (event.plan && !row.informational) {
      for (const PlanLine& line : event.plan->lines)
        if (line.category.rfind(group.category, 0) == 0) row.predicted = std::max<int64_t>(0, row.predicted) + line.bytes;
    }
    rows.push_back(row);
  }
  int64_t predicted_named = 0;
  for (const Row& r : rows)
    if (!r.informational) predicted_named += std::max<int64_t>(0, r.predicted);

  out << "  " << std::left << std::setw(66) << "category" << std::right << std::setw(12) << "predicted" << std::setw(12)
      << "actual" << "\n";
  for (const Row& r : rows) {
    if (r.informational) continue;
    out << "  " << std::left << std::setw(66) << r.category << std::right << std::setw(12)
        << (r.predicted >= 0 ? format_bytes(r.predicted) : "—") << std::setw(12) << format_bytes(r.actual) << "\n";
  }
  const int64_t rest_actual = std::max<int64_t>(0, event.figures.peak_bytes - attributed);
  const int64_t rest_predicted = event.plan ? event.plan->peak_bytes - predicted_named : -1;
  out << "  " << std::left << std::setw(66)
      << "the rest at the peak: target, activations, loss, workspace" << std::right << std::setw(12)
      << (rest_predicted >= 0 ? format_bytes(rest_predicted) : "—") << std::setw(12) << format_bytes(rest_actual) << "\n";
  for (const Row& r : rows)
    if (r.informational)
      out << "  " << std::left << std::setw(66) << ("  of which " + r.category) << std::right << std::setw(12) << ""
          << std::setw(12) << format_bytes(r.actual) << "\n";
  out << "  " << std::left << std::setw(66) << "peak" << std::right << std::setw(12)
      << (event.plan ? format_bytes(event.plan->peak_bytes) : "—") << std::setw(12) << format_bytes(event.figures.peak_bytes)
      << "\n";
  if (event.plan) {
    out << "  (predicted peak phase: " << phase_name(event.plan->peak_phase) << "; planned total with slack "
        << format_bytes(event.plan->total_bytes) << ")\n";
    if (!event.plan->complete()) out << "  (the plan is incomplete: " << event.plan->missing.front() << ")\n";
  }

  std::sort(largest.begin(), largest.end(), [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  out << "\n  largest live tensors the host can name:\n";
  for (size_t i = 0; i < std::min<size_t>(10, largest.size()); ++i)
    out << "    " << std::right << std::setw(11) << format_bytes(std::get<0>(largest[i])) << "  " << std::get<1>(largest[i])
        << "  (" << std::get<2>(largest[i]) << ")\n";
  if (largest.empty()) out << "    (none on " << event.device << ")\n";
  return out.str();
}

}  // namespace dflash::memory
