#include "train/train_schema.h"

#include <dflash/sdk/schema.hpp>

namespace dflash::train {

const nlohmann::json& train_schema() {
  using sdk::Bounds;
  static const nlohmann::json schema =
      sdk::Schema()
          .integer("seed", 0, "seed for every random choice of the run (data order, init, anchors)", Bounds::at_least(0))
          .string("device", "cpu", "where the drafter trains: cpu, cuda or cuda:N")
          .string("dtype", "float32", "compute dtype of the drafter", {"float32", "bfloat16", "float16"})
          .integer("steps", 1000, "optimizer steps to run", Bounds::at_least(1))
          .number("lr", 6e-4, "peak learning rate handed to the scheduler", Bounds::above(0))
          .string("output_dir", "runs/default", "where checkpoints and metrics are written")
          .json();
  return schema;
}

}  // namespace dflash::train
