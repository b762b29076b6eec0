// What the trainer asks of its optimizer: AdamW on one process
// (train/adamw.h), or AdamW sharded across the ranks (ZeRO-1,
// train/sharded_adamw.h).
#pragma once

#include "plugin/host_api.h"

namespace dflash::train {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update with learning rate lr from the gradients now in .grad(),
  // each multiplied by grad_factor first (global-norm clipping; in the same
  // pass as the update where the kernel allows); parameters without a
  // gradient are left alone.
  virtual void step(double lr, double grad_factor = 1.0) = 0;
  virtual void zero_grad() = 0;
  // The whole state, under the names a checkpoint stores ("exp_avg.<param>",
  // "exp_avg_sq.<param>", "master.<param>", "step"). Sharded: a collective
  // (every rank calls it; every rank gets the whole state).
  virtual host::NamedTensors state() = 0;
  // What this process holds (an out-of-memory report names it).
  virtual host::NamedTensors local_state() const = 0;
  // Restores a whole state(), from any world size; keeps what this rank owns.
  virtual void load_state(const host::NamedTensors& state) = 0;
  // What ran this process's last update: "ours", "aten" (the fused
  // kernels) or "loop".
  virtual const char* last_kernel() const = 0;
};

}  // namespace dflash::train
