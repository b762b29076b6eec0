// The messages from target ranks to drafter ranks, over c10d point to point
// (NCCL between GPUs, Gloo on the CPU): no pickling, no files. Each answers
// a credit (pipeline/credits.h): a header of four int64 {kind, step, micro,
// meta bytes}, the meta as JSON text (each tensor's name, part, dtype and
// shape; the sender's figures; the data position where it matters), then
// the tensors, one message each.
#pragma once

#include "dist/collective.h"
#include "plugin/host_api.h"

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <vector>
#include <string>

namespace dflash::pipeline {

inline constexpr int kItemTag = 17;

enum class ItemKind : int64_t {
  kItem = 1,     // a micro-batch: the batch and the target's outputs
  kStepEnd = 2,  // target rank 0: the data position after a step's batches
  kEnd = 3,      // no item: the data ended (or the run is stopping)
};

// One item: what a drafter needs of one packed batch. `batch`: the data
// source's tensors (input ids, loss mask, positions, document ids: CPU on
// both sides); `features`: the target's outputs (the chosen layers' hidden
// states, the final normed hidden state when the loss wants a teacher), on
// the target's device when sent and the drafter's when received.
struct Item {
  ItemKind kind = ItemKind::kItem;
  int64_t step = 0, micro = 0;
  host::NamedTensors batch, features;
  nlohmann::json meta = nlohmann::json::object();  // "data_state", "figures"
};

// Bytes of the tensors of an item (what a drafter's queue slot holds).
int64_t item_bytes(const Item& item);

// Sends `item` to world rank `to` and waits until it is sent; with
// `later`, the sends are only begun, and their waits go there.
void send_item(dist::Collective& world, int to, const Item& item,
               std::vector<std::unique_ptr<dist::Pending>>* later = nullptr);
// Receives the next message from rank `from`; the features land on
// `device`. `what` names it in errors ("item of step 3, micro-batch 2").
Item receive_item(dist::Collective& world, int from, const c10::Device& device, const std::string& what);

}  // namespace dflash::pipeline
