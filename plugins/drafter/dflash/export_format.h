// The drafter as a Hugging Face directory (config.json + model.safetensors)
// that z-lab's reference DFlashDraftModel — the transformers-based model users
// serve DFlash drafters with — loads as it is (docs/drafter.md, "Serving: the
// reference DFlashDraftModel"):
// - the tensor names are DFlashModel's parameter names, which are already the
//   reference's state_dict keys, so nothing is renamed on the way out;
// - config.json is a Qwen3 config plus the DFlash fields, written here and
//   read back here (for our own tools and for directories older builds wrote).
#pragma once

#include "dflash_model.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace dflash::drafter {

// What config.json says beyond the layers' shape.
struct ExportFacts {
  int64_t target_layers = 0;  // the target's decoder layers (num_target_layers)
  int64_t vocab = 0;          // the target's vocabulary (the drafter shares its embedding and lm_head)
  int64_t max_position_embeddings = 0;  // the target's; 0 = not known
  std::vector<int64_t> layer_ids;       // target_layer_ids, in fc's input order
  int64_t block_size = 0, mask_token = 0, max_anchors = 0;
  double gamma = 0, init_std = 0;
};

// config.json's fields (the checkpoint writer adds the weights' dtype).
nlohmann::json export_config(const DrafterShape& shape, const ExportFacts& facts);

// What a drafter directory's config.json says, read back: the layers' shape,
// target_layer_ids, block_size and mask_token_id (from dflash_config, or the
// top level as older builds wrote them). Throws std::invalid_argument naming
// the field that is missing or wrong.
struct ExportedDrafter {
  DrafterShape shape;
  std::vector<int64_t> layer_ids;
  int64_t block_size = 0, mask_token = 0, target_layers = 0;
};
ExportedDrafter read_export_config(const nlohmann::json& config);

}  // namespace dflash::drafter
