#include "block_layout.h"

#include <host_upload.h>

#include <dflash/abi.h>
#include <dflash/sdk/splitmix.hpp>
#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dflash::drafter {
namespace {


at::Tensor cpu_long(const at::Tensor& t) { return t.to(at::kCPU, at::kLong).contiguous(); }

}  // namespace

std::vector<int64_t> anchor_candidates(const int64_t* loss_mask, const int64_t* documents, int64_t length) {
  std::vector<int64_t> out;
  for (int64_t p = 0; p + 1 < length; ++p)
    if (loss_mask[p] != 0 && loss_mask[p + 1] != 0 && documents[p] == documents[p + 1]) out.push_back(p);
  return out;
}

at::Tensor sample_anchors(const at::Tensor& loss_mask_in, const at::Tensor& documents_in, int64_t max_anchors,
                          uint64_t seed) {
  const at::Tensor loss_mask = cpu_long(loss_mask_in), documents = cpu_long(documents_in);
  const int64_t rows = loss_mask.size(0), length = loss_mask.size(1);
  std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(rows));
  int64_t widest = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> candidates =
        anchor_candidates(loss_mask.data_ptr<int64_t>() + r * length, documents.data_ptr<int64_t>() + r * length, length);
    const auto take = std::min<int64_t>(max_anchors, static_cast<int64_t>(candidates.size()));
    uint64_t state = sdk::splitmix64(seed ^ sdk::splitmix64(static_cast<uint64_t>(r) + 1));
    for (int64_t i = 0; i < take; ++i) {  // partial Fisher–Yates
      state = sdk::splitmix64(state);
      const auto j = i + static_cast<int64_t>(state % static_cast<uint64_t>(candidates.size() - i));
      std::swap(candidates[i], candidates[j]);
    }
    candidates.resize(static_cast<size_t>(take));
    std::sort(candidates.begin(), candidates.end());
    widest = std::max(widest, take);
    chosen[r] = std::move(candidates);
  }
  at::Tensor anchors = at::full({rows, widest}, -1, at::kLong);
  auto a = anchors.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < chosen[r].size(); ++i) a[r][static_cast<int64_t>(i)] = chosen[r][i];
  return anchors;
}

BlockLayout layout_blocks(const at::Tensor& input_ids_in, const at::Tensor& position_ids_in,
                          const at::Tensor& documents_in, const at::Tensor& loss_mask_in, const at::Tensor& anchors_in,
                          int64_t block_size, int64_t mask_token_id) {
  const at::Tensor ids = cpu_long(input_ids_in), positions = cpu_long(position_ids_in);
  const at::Tensor documents = cpu_long(documents_in), loss_mask = cpu_long(loss_mask_in), anchors = cpu_long(anchors_in);
  const int64_t rows = ids.size(0), length = ids.size(1), count = anchors.size(1), slots = count * block_size;
  BlockLayout out;
  out.block_size = block_size;
  out.anchors = count;
  out.anchor = anchors;
  out.slot_ids = at::full({rows, slots}, mask_token_id, at::kLong);
  out.slot_positions = at::zeros({rows, slots}, at::kLong);
  out.targets = at::full({rows, slots}, DFLASH_IGNORE_INDEX, at::kLong);
  out.teacher_index = at::zeros({rows, slots}, at::kLong);
  out.block_valid = at::zeros({rows, slots}, at::kBool);
  auto id = ids.accessor<int64_t, 2>();
  auto pos = positions.accessor<int64_t, 2>();
  auto doc = documents.accessor<int64_t, 2>();
  auto mask = loss_mask.accessor<int64_t, 2>();
  auto anc = anchors.accessor<int64_t, 2>();
  auto sid = out.slot_ids.accessor<int64_t, 2>();
  auto spos = out.slot_positions.accessor<int64_t, 2>();
  auto tgt = out.targets.accessor<int64_t, 2>();
  auto tix = out.teacher_index.accessor<int64_t, 2>();
  auto valid = out.block_valid.accessor<bool, 2>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < count; ++b) {
      const int64_t a = anc[r][b];
      if (a < 0) continue;
      if (a >= length) throw std::invalid_argument("anchor outside the row");
      for (int64_t k = 0; k < block_size; ++k) {
        const int64_t s = b * block_size + k, p = a + k;
        valid[r][s] = true;
        spos[r][s] = pos[r][a] + k;
        if (k == 0) sid[r][s] = id[r][a];
        if (k >= 1 && p < length && doc[r][p] == doc[r][a] && mask[r][p] != 0) {
          tgt[r][s] = id[r][p];
          tix[r][s] = p - 1;
        }
      }
    }
  return out;
}

at::Tensor block_attention_mask(const at::Tensor& anchors_in, const at::Tensor& documents_in, int64_t block_size) {
  const at::Tensor anchors = cpu_long(anchors_in), documents = cpu_long(documents_in);
  const int64_t rows = documents.size(0), length = documents.size(1), count = anchors.size(1);
  const int64_t slots = count * block_size;
  // Context part: key j < anchor and same document as the anchor.
  const at::Tensor anchor_of_slot = anchors.repeat_interleave(block_size, 1);  // [B, A·Bs]
  const at::Tensor safe_anchor = anchor_of_slot.clamp_min(0);
  const at::Tensor anchor_doc = documents.gather(1, safe_anchor);             // [B, A·Bs]
  const at::Tensor key = at::arange(length, at::kLong);
  const at::Tensor context = key.view({1, 1, length}).lt(anchor_of_slot.unsqueeze(2))
                                 .logical_and(documents.unsqueeze(1).eq(anchor_doc.unsqueeze(2)));  // [B, A·Bs, S]
  // Block part: same block.
  const at::Tensor block_of_slot = at::arange(slots, at::kLong).div(block_size, "floor");
  const at::Tensor own = block_of_slot.view({slots, 1}).eq(block_of_slot.view({1, slots})).unsqueeze(0).expand({rows, slots, slots});
  return at::cat({context, own}, 2);
}

std::vector<AttentionGroup> attention_groups(const at::Tensor& anchors_in, const at::Tensor& documents_in, int64_t group_blocks,
                                             int64_t key_multiple) {
  if (group_blocks < 1) throw std::invalid_argument("attention_groups: group_blocks must be at least 1");
  if (key_multiple < 1) throw std::invalid_argument("attention_groups: key_multiple must be at least 1");
  const at::Tensor anchors = cpu_long(anchors_in), documents = cpu_long(documents_in);
  const int64_t rows = documents.size(0), count = anchors.size(1);
  auto anc = anchors.accessor<int64_t, 2>();
  auto doc = documents.accessor<int64_t, 2>();
  std::vector<AttentionGroup> groups;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t first = 0; first < count; first += group_blocks) {
      AttentionGroup g;
      g.row = r;
      g.first_block = first;
      g.blocks = std::min(group_blocks, count - first);
      int64_t begin = -1, end = 0;
      for (int64_t b = first; b < first + g.blocks; ++b) {
        const int64_t a = anc[r][b];
        if (a < 0) continue;  // padding: sees only its own block
        int64_t start = a;    // the first position of a's document
        while (start > 0 && doc[r][start - 1] == doc[r][a]) --start;
        begin = begin < 0 ? start : std::min(begin, start);
        end = std::max(end, a);
      }
      g.context_begin = begin < 0 ? 0 : begin;
      g.context_end = begin < 0 ? 0 : end;
      const int64_t length = g.context_end - g.context_begin;
      if (length > 0 && key_multiple > 1) {
        const int64_t widened = std::min(documents.size(1), (length + key_multiple - 1) / key_multiple * key_multiple);
        g.context_begin = std::max<int64_t>(0, g.context_end - widened);
        g.context_end = g.context_begin + widened;
      }
      groups.push_back(g);
    }
  return groups;
}

at::Tensor stacked_group_attention_masks(const std::vector<AttentionGroup>& groups, const at::Tensor& anchors,
                                         const at::Tensor& documents, int64_t block_size) {
  if (groups.empty()) throw std::invalid_argument("stacked_group_attention_masks: no groups");
  const int64_t queries = groups[0].queries(block_size), context = groups[0].context_end - groups[0].context_begin;
  // Each group's row, first block and context begin, [3, n], in one upload.
  const auto n = static_cast<int64_t>(groups.size());
  std::vector<int64_t> described(static_cast<size_t>(3 * n));
  for (int64_t i = 0; i < n; ++i) {
    const AttentionGroup& g = groups[static_cast<size_t>(i)];
    if (g.queries(block_size) != queries || g.context_end - g.context_begin != context)
      throw std::invalid_argument("stacked_group_attention_masks: the groups differ in shape");
    described[static_cast<size_t>(i)] = g.row;
    described[static_cast<size_t>(n + i)] = g.first_block;
    described[static_cast<size_t>(2 * n + i)] = g.context_begin;
  }
  const auto longs = anchors.options().dtype(at::kLong);
  const at::Tensor groups_of = decode_support::upload(described, longs.device()).view({3, n, 1});  // without waiting
  const at::Tensor row = groups_of[0];                                                  // [n, 1]
  const at::Tensor block = at::arange(queries, longs).div(block_size, "floor");         // each query's block in its group
  const at::Tensor anchor = anchors.index({row, groups_of[1] + block.unsqueeze(0)});    // [n, Q]
  const at::Tensor anchor_doc = documents.index({row, anchor.clamp_min(0)});            // [n, Q]
  const at::Tensor key = groups_of[2] + at::arange(context, longs);                     // [n, C]
  const at::Tensor key_doc = documents.index({row, key});                                                              // [n, C]
  const at::Tensor sees_context = key.unsqueeze(1).lt(anchor.unsqueeze(2)).logical_and(key_doc.unsqueeze(1).eq(anchor_doc.unsqueeze(2)));
  const at::Tensor own_block = block.view({queries, 1}).eq(block.view({1, queries})).unsqueeze(0).expand({row.size(0), queries, queries});
  return at::cat({sees_context, own_block}, 2);
}

at::Tensor slot_weights(int64_t block_size, double gamma) {
  at::Tensor k = at::arange(block_size, at::kDouble);
  at::Tensor w = at::exp(-(k - 1) / gamma);
  w.index_put_({0}, 0.0);
  return w.to(at::kFloat);
}

}  // namespace dflash::drafter
