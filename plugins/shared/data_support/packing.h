// Packing tokenised sequences into fixed-shape batches, shared by the data
// source plugins. A batch is `rows` rows of `row_length` tokens; each row
// holds whole sequences (documents) back to back, positions restarting at
// each, and padding after the last as a document of its own with loss_mask 0.
#pragma once

#include <dflash/sdk/memory_plan.hpp>
#include <dflash/sdk/torch.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::data {

struct Sequence {
  std::vector<int64_t> ids;
  std::vector<uint8_t> loss_mask;  // 1 where the token is supervised
};

// Whether some token and the next one are both supervised: an anchor needs
// that, so a sequence without such a pair teaches the drafter nothing.
bool has_supervised_pair(const std::vector<uint8_t>& loss_mask);

class BatchPacker {
 public:
  BatchPacker(int64_t rows, int64_t row_length, int64_t pad_id);

  // Places the sequence in the first row with room. False when no row has
  // room: the batch is complete and the sequence belongs to the next one.
  // A sequence longer than row_length never fits (the caller trims first).
  bool try_add(const Sequence& sequence);
  bool empty() const { return documents_ == 0; }
  int64_t documents() const { return documents_; }

  // The batch: "input_ids", "loss_mask" (int64), "position_ids",
  // "document_ids", all [rows', row_length] on the CPU, where rows' counts
  // the rows holding at least one sequence. Resets the packer.
  sdk::TensorDict finish();

  // Tokens placed / tokens the finished batches could hold, over the packer's life.
  double fill_ratio() const;

 private:
  int64_t rows_, row_length_, pad_id_;
  std::vector<std::vector<const Sequence*>> placed_;
  std::vector<int64_t> used_;
  std::vector<Sequence> owned_;
  int64_t documents_ = 0;
  int64_t tokens_placed_ = 0, tokens_capacity_ = 0;
};

// The memory planner's view of a packed source (ABI 1.2 plan_memory): every
// batch is [tokens_per_batch / row_length, row_length], kept on the CPU, so
// only the shape is reported; "effective" gives the token budget that shape
// really uses. `section` names the config section in messages ("data.jsonl").
sdk::MemoryPlan packed_batch_plan(const nlohmann::json& config, const std::string& section);

}  // namespace dflash::data
