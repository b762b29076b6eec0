#include "pipeline/item.h"

#include <ATen/ATen.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace dflash::pipeline {
namespace {

// The dtypes an item may carry, by the names its header uses.
const std::vector<std::pair<const char*, c10::ScalarType>>& dtypes() {
  static const std::vector<std::pair<const char*, c10::ScalarType>> table = {
      {"float32", at::kFloat}, {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}, {"float64", at::kDouble},
      {"int64", at::kLong},    {"int32", at::kInt},         {"int16", at::kShort},  {"int8", at::kChar},
      {"uint8", at::kByte},    {"bool", at::kBool}};
  return table;
}

std::string dtype_name(c10::ScalarType type, const std::string& tensor) {
  for (const auto& [name, t] : dtypes())
    if (t == type) return name;
  throw std::invalid_argument("item tensor '" + tensor + "' has dtype " + std::string(c10::toString(type)) +
                              ", which the pipeline does not carry");
}

c10::ScalarType dtype_of(const std::string& name, const std::string& tensor) {
  for (const auto& [n, t] : dtypes())
    if (name == n) return t;
  throw std::runtime_error("item header: tensor '" + tensor + "' has unknown dtype '" + name + "'");
}

std::string label(const Item& item) {
  return item.kind == ItemKind::kItem ? "item of step " + std::to_string(item.step) + ", micro-batch " + std::to_string(item.micro)
                                      : "message of step " + std::to_string(item.step);
}

}  // namespace

int64_t item_bytes(const Item& item) {
  int64_t bytes = 0;
  for (const auto* part : {&item.batch, &item.features})
    for (const auto& [name, t] : *part) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

void send_item(dist::Collective& world, int to, const Item& item, std::vector<std::unique_ptr<dist::Pending>>* later) {
  nlohmann::json meta = item.meta;
  nlohmann::json tensors = nlohmann::json::array();
  std::vector<at::Tensor> payload;
  for (const auto& [part, list] : {std::pair<const char*, const host::NamedTensors*>{"batch", &item.batch},
                                   std::pair<const char*, const host::NamedTensors*>{"features", &item.features}}) {
    for (const auto& [name, t] : *list) {
      tensors.push_back({{"name", name}, {"part", part}, {"dtype", dtype_name(t.scalar_type(), name)}, {"shape", t.sizes().vec()}});
      if (t.numel() > 0) payload.push_back(t.contiguous());
    }
  }
  meta["tensors"] = std::move(tensors);
  const std::string text = meta.dump();
  const std::string what = label(item);
  std::vector<std::unique_ptr<dist::Pending>> sends;
  sends.push_back(world.send_async(
      at::tensor({static_cast<int64_t>(item.kind), item.step, item.micro, static_cast<int64_t>(text.size())}, at::kLong), to,
      kItemTag, what + " (header)"));
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  sends.push_back(world.send_async(bytes, to, kItemTag, what + " (meta)"));
  for (size_t i = 0; i < payload.size(); ++i)
    sends.push_back(world.send_async(payload[i], to, kItemTag, what + " (tensor " + std::to_string(i) + ")"));
  if (later) {
    for (auto& s : sends) later->push_back(std::move(s));
    return;
  }
  for (auto& s : sends) s->wait();
}

Item receive_item(dist::Collective& world, int from, const c10::Device& device, const std::string& what) {
  at::Tensor header = at::empty({4}, at::kLong);
  world.recv(header, from, kItemTag, what + " (header)");
  const int64_t* h = header.data_ptr<int64_t>();
  Item item;
  if (h[0] < 1 || h[0] > 3 || h[3] < 0 || h[3] > (int64_t{1} << 30))
    throw std::runtime_error("rank " + std::to_string(from) + " sent a malformed header for " + what +
                             " (kind " + std::to_string(h[0]) + ", " + std::to_string(h[3]) +
                             " meta bytes): are both ranks the same dflash-host?");
  item.kind = static_cast<ItemKind>(h[0]);
  item.step = h[1];
  item.micro = h[2];
  at::Tensor bytes = at::empty({h[3]}, at::kByte);
  if (h[3] > 0) world.recv(bytes, from, kItemTag, what + " (meta)");
  item.meta = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(h[3])));
  std::vector<std::unique_ptr<dist::Pending>> receives;
  for (const auto& entry : item.meta.at("tensors")) {
    const std::string name = entry.at("name"), part = entry.at("part");
    const bool feature = part == "features";
    at::Tensor t = at::empty(entry.at("shape").get<std::vector<int64_t>>(),
                             at::TensorOptions().dtype(dtype_of(entry.at("dtype"), name)).device(feature ? device : c10::Device(at::kCPU)));
    if (t.numel() > 0)
      receives.push_back(world.recv_async(t, from, kItemTag, what + " (" + name + ")"));
    (feature ? item.features : item.batch).emplace_back(name, t);
  }
  for (auto& r : receives) r->wait();
  item.meta.erase("tensors");
  return item;
}

}  // namespace dflash::pipeline
