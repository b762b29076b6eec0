#include "train/frozen_weights.h"

#include <ATen/ATen.h>

#include <map>
#include <stdexcept>

namespace dflash::host {

NamedTensors place_frozen_weights(const NamedTensors& from_target, const std::string& target_name,
                                  const c10::Device& device, c10::ScalarType dtype) {
  std::map<std::string, at::Tensor> by_name(from_target.begin(), from_target.end());
  NamedTensors placed;
  for (const char* name : kFrozenWeightNames) {
    auto it = by_name.find(name);
    if (it == by_name.end() || !it->second.defined())
      throw std::invalid_argument("target model plugin '" + target_name + "': frozen_weights returned no '" + name +
                                  "' (a target must return embed_tokens, lm_head and final_norm)");
    const at::Tensor& source = it->second;
    // A tensor already copied under another name (tied weights) is reused.
    at::Tensor copy;
    for (size_t i = 0; i < placed.size(); ++i) {
      const at::Tensor& earlier = by_name.at(placed[i].first);
      if (earlier.is_same(source) ||
          (earlier.data_ptr() == source.data_ptr() && earlier.sizes() == source.sizes() && earlier.strides() == source.strides()))
        copy = placed[i].second;
    }
    if (!copy.defined()) {
      const bool already_there = same_device(source.device(), device) && source.scalar_type() == dtype;
      copy = already_there ? source.detach()
                           : source.detach().to(device, dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
    }
    placed.emplace_back(name, copy);
  }
  return placed;
}

}  // namespace dflash::host
