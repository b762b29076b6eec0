#include "train/stages.h"

#include <dflash/sdk/splitmix.hpp>

#include <ATen/ATen.h>

namespace dflash::train {

using host::find_tensor;
using host::require_tensor;

void produce(const Run& run, MicroBatch& mb, std::string& phase, PhaseTimer& timer) {
  const c10::Device device(run.settings().device);
  phase = "target forward";
  for (const auto& [name, tensor] : mb.batch) mb.on_device.emplace_back(name, tensor.to(device));
  timer.end("batch to device");
  mb.hidden = run.target().forward(mb.on_device, run.drafter_facts().target_layer_ids, run.settings().wants_teacher(),
                                   /*want_logits=*/false);
  timer.end("target forward");
}

uint64_t sample_seed(uint64_t seed, int64_t step, int64_t micro) {
  return sdk::splitmix64(seed ^ sdk::splitmix64(static_cast<uint64_t>(step) * 4096 + static_cast<uint64_t>(micro)));
}

void draft_and_score(const Run& run, MicroBatch& mb, int64_t step, int64_t micro, std::string& phase, PhaseTimer& timer) {
  phase = "drafter forward + loss";
  host::NamedTensors inputs = mb.batch;
  for (const auto& entry : mb.hidden) inputs.push_back(entry);
  inputs.emplace_back("sample_seed",
                      at::scalar_tensor(static_cast<int64_t>(sample_seed(run.settings().seed, step, micro) >> 1), at::kLong));
  mb.drafted = run.drafter().forward(inputs);
  timer.end("drafter forward");
  mb.call.hidden = require_tensor(mb.drafted, "hidden", "the drafter");
  mb.call.lm_head_weight = run.lm_head();
  mb.call.targets = require_tensor(mb.drafted, "targets", "the drafter");
  mb.call.row_weights = find_tensor(mb.drafted, "row_weights");
  if (run.settings().wants_teacher() && find_tensor(mb.drafted, "teacher_hidden").defined()) {
    mb.call.teacher = DFLASH_TEACHER_HIDDEN;
    mb.call.teacher_hidden = find_tensor(mb.drafted, "teacher_hidden");
    mb.call.teacher_lm_head_weight = run.teacher_lm_head();
  }
  mb.out = run.loss().compute(mb.call);
  timer.end("loss");
  mb.on_device.clear();
  mb.hidden.clear();
}

}  // namespace dflash::train
