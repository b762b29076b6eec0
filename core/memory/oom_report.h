// What the trainer prints when the device runs out of memory: where in the
// step it happened, the allocator's figures, predicted vs actual memory by
// category (actual = the live tensors the host can name), and the largest of
// those tensors. The rest of the allocation — autograd's saved activations,
// plugin-internal buffers such as the target's layers — is reported as one
// remainder beside what the plan predicted for it.
#pragma once

#include "memory/memory_plan.h"
#include "memory/memory_stats.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace dflash::memory {

// Tensors the host can name, grouped by the plan's category prefixes
// ("drafter weights", "AdamW states", …).
struct NamedGroup {
  std::string category;  // a plan category prefix
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  // Shown for information only, inside another category's figures (e.g. the
  // frozen verifier weights, part of the target's weights).
  bool part_of_remainder = false;
};

struct OomEvent {
  std::string device;
  int64_t step = 0;
  std::string phase;  // "drafter backward", …
  std::string error;  // the allocator's or plugin's message, first line
  MemoryFigures figures;
  std::optional<DevicePlan> plan;
  std::vector<NamedGroup> groups;
};

// Whether an exception is an out-of-memory error: LibTorch's
// c10::OutOfMemoryError, std::bad_alloc, or a plugin's DFLASH_ERR_OUT_OF_MEMORY.
bool is_out_of_memory(const std::exception& e);

std::string format_oom_report(const OomEvent& event);

// LibTorch's CUDA out-of-memory message without its advice paragraph:
// "CUDA out of memory. Tried to allocate 1.25 GiB; GPU 0 has a total
// capacity of 139.80 GiB of which 1.25 GiB is free". Other messages unchanged.
std::string short_oom_message(const std::string& message);

// Total bytes of distinct storages (a storage shared by two names counts once).
int64_t storage_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace dflash::memory
