#include "packing.h"

#include <torch/types.h>

#include <stdexcept>

namespace dflash::data {

bool has_supervised_pair(const std::vector<uint8_t>& loss_mask) {
  for (size_t i = 0; i + 1 < loss_mask.size(); ++i)
    if (loss_mask[i] && loss_mask[i + 1]) return true;
  return false;
}

BatchPacker::BatchPacker(int64_t rows, int64_t row_length, int64_t pad_id)
    : rows_(rows), row_length_(row_length), pad_id_(pad_id), placed_(rows), used_(rows, 0) {
  if (rows < 1 || row_length < 2) throw std::invalid_argument("a batch needs at least 1 row of at least 2 tokens");
  owned_.reserve(static_cast<size_t>(rows * row_length));  // no reallocation: placed_ points into it
}

bool BatchPacker::try_add(const Sequence& sequence) {
  const auto length = static_cast<int64_t>(sequence.ids.size());
  if (length > row_length_ || length == 0) return false;
  for (int64_t r = 0; r < rows_; ++r) {
    if (used_[r] + length <= row_length_) {
      owned_.push_back(sequence);
      placed_[r].push_back(&owned_.back());
      used_[r] += length;
      ++documents_;
      return true;
    }
  }
  return false;
}

sdk::TensorDict BatchPacker::finish() {
  int64_t rows = 0;
  for (int64_t r = 0; r < rows_; ++r) rows += placed_[r].empty() ? 0 : 1;
  auto ids = torch::full({rows, row_length_}, pad_id_, torch::kLong);
  auto mask = torch::zeros({rows, row_length_}, torch::kLong);
  auto positions = torch::zeros({rows, row_length_}, torch::kLong);
  auto documents = torch::zeros({rows, row_length_}, torch::kLong);
  auto id = ids.accessor<int64_t, 2>();
  auto m = mask.accessor<int64_t, 2>();
  auto p = positions.accessor<int64_t, 2>();
  auto d = documents.accessor<int64_t, 2>();
  int64_t out_row = 0;
  for (int64_t r = 0; r < rows_; ++r) {
    if (placed_[r].empty()) continue;
    int64_t column = 0, document = 0;
    for (const Sequence* s : placed_[r]) {
      for (size_t i = 0; i < s->ids.size(); ++i, ++column) {
        id[out_row][column] = s->ids[i];
        m[out_row][column] = s->loss_mask[i] ? 1 : 0;
        p[out_row][column] = static_cast<int64_t>(i);
        d[out_row][column] = document;
      }
      ++document;
    }
    for (int64_t i = 0; column < row_length_; ++column, ++i) {  // padding: its own document, never supervised
      p[out_row][column] = i;
      d[out_row][column] = document;
    }
    tokens_placed_ += used_[r];
    ++out_row;
  }
  tokens_capacity_ += rows * row_length_;
  placed_.assign(rows_, {});
  used_.assign(rows_, 0);
  owned_.clear();
  documents_ = 0;
  return {{"input_ids", ids}, {"loss_mask", mask}, {"position_ids", positions}, {"document_ids", documents}};
}

double BatchPacker::fill_ratio() const {
  return tokens_capacity_ == 0 ? 0.0 : static_cast<double>(tokens_placed_) / static_cast<double>(tokens_capacity_);
}

sdk::MemoryPlan packed_batch_plan(const nlohmann::json& config, const std::string& section) {
  const int64_t row_length = config.at("row_length").get<int64_t>();
  const int64_t rows = config.at("tokens_per_batch").get<int64_t>() / row_length;
  if (rows < 1)
    throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, section + ".tokens_per_batch: must be at least row_length (" +
                                                      std::to_string(row_length) + ")");
  sdk::MemoryPlan plan;
  plan.facts = {{"rows", rows}, {"row_length", row_length}, {"effective", {{"tokens_per_batch", rows * row_length}}}};
  return plan;
}

}  // namespace dflash::data
