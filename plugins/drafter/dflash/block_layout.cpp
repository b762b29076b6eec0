#include "block_layout.h"

#include <host_upload.h>

#include <dflash/abi.h>
#include <dflash/sdk/splitmix.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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

BlockKernelLayout block_kernel_layout(const at::Tensor& anchors_in, const at::Tensor& documents_in, int64_t block_size,
                                      int64_t group_blocks, int64_t key_multiple) {
  constexpr int64_t kRowsPerEntry = cuda_kernels::kEntryRows, kTile = cuda_kernels::kKeyTileRows;
  if (!cuda_kernels::block_size_fits(block_size))
    throw std::invalid_argument("block_kernel_layout: block_size is " + std::to_string(block_size) + "; the kernels take " +
                                cuda_kernels::block_sizes_in_words());
  if (group_blocks < 1 || key_multiple < 1)
    throw std::invalid_argument("block_kernel_layout: group_blocks and key_multiple must be at least 1");
  const at::Tensor anchors = cpu_long(anchors_in), documents = cpu_long(documents_in);
  const int64_t rows = documents.size(0), length = documents.size(1), count = anchors.size(1);
  const int64_t queries_per_row = count * block_size, keys_per_row = length + queries_per_row;
  auto anc = anchors.accessor<int64_t, 2>();
  auto doc = documents.accessor<int64_t, 2>();
  BlockKernelLayout layout;
  std::vector<int64_t> document_start(static_cast<size_t>(length));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p < length; ++p)
      document_start[static_cast<size_t>(p)] = p > 0 && doc[r][p - 1] == doc[r][p] ? document_start[static_cast<size_t>(p - 1)] : p;
    const int64_t query_base = r * queries_per_row, key_base = r * keys_per_row;
    const auto first_entry = static_cast<int64_t>(layout.blocks.size());
    auto add_block = [&](int64_t block, int64_t context_begin, int64_t context_end) {
      for (int64_t h = 0; h < block_size; h += kRowsPerEntry)
        layout.blocks.push_back({query_base + block * block_size + h, key_base, context_begin, context_end,
                                 key_base + length + block * block_size, block_size});
    };
    for (int64_t first = 0; first < count;) {
      const int64_t a = anc[r][first];
      if (a < 0) {  // padding: its own slots only
        add_block(first++, 0, 0);
        continue;
      }
      if (a >= length) throw std::invalid_argument("block_kernel_layout: anchor outside the row");
      const int64_t start = document_start[static_cast<size_t>(a)];
      int64_t end = first + 1;  // the group: consecutive real blocks of a's document
      while (end < count && end - first < group_blocks && anc[r][end] >= 0 && anc[r][end] < length &&
             document_start[static_cast<size_t>(anc[r][end])] == start)
        ++end;
      // Anchors ascend, so the first block's context is the group's shortest.
      const int64_t prefix = (a - start) / key_multiple * key_multiple;
      if (prefix > 0)
        layout.prefixes.push_back({query_base + first * block_size, (end - first) * block_size, key_base + start, prefix});
      for (int64_t b = first; b < end; ++b) add_block(b, start + prefix, anc[r][b]);
      first = end;
    }
    const auto last_entry = static_cast<int64_t>(layout.blocks.size());
    // Context tiles: the entries of this row that see any of each.
    for (int64_t p0 = 0; p0 < length; p0 += kTile) {
      int64_t lowest = -1, highest = -1;
      for (int64_t e = first_entry; e < last_entry; ++e) {
        const cuda_kernels::BlockKeys& b = layout.blocks[static_cast<size_t>(e)];
        if (b.context_begin < std::min(p0 + kTile, length) && b.context_end > p0) {
          if (lowest < 0) lowest = e;
          highest = e;
        }
      }
      if (lowest < 0) continue;
      layout.tiles.push_back({key_base + p0, p0, 0, static_cast<int32_t>(std::min(kTile, length - p0)),
                              static_cast<int32_t>(lowest), static_cast<int32_t>(highest + 1)});
    }
    // Slot tiles: each block's slots, seen by its entries.
    for (int64_t e = first_entry; e < last_entry; e += block_size / kRowsPerEntry)
      layout.tiles.push_back({layout.blocks[static_cast<size_t>(e)].slot_row, -1, 0, static_cast<int32_t>(block_size),
                              static_cast<int32_t>(e), static_cast<int32_t>(e + block_size / kRowsPerEntry)});
  }
  if (layout.blocks.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw std::invalid_argument("block_kernel_layout: more entries than a KeyTile can index");
  return layout;
}

BlockKernelTables block_kernel_tables(const BlockKernelLayout& layout, const c10::Device& device) {
  BlockKernelTables tables;
  tables.prefixes = at::empty({static_cast<int64_t>(layout.prefixes.size()), kPrefixColumns}, at::kLong);
  auto p = tables.prefixes.accessor<int64_t, 2>();
  for (size_t i = 0; i < layout.prefixes.size(); ++i) {
    const PrefixCall& c = layout.prefixes[i];
    const auto row = static_cast<int64_t>(i);
    p[row][kPrefixQueryRow] = c.query_row, p[row][kPrefixQueries] = c.queries, p[row][kPrefixKeyRow] = c.key_row;
    p[row][kPrefixKeys] = c.keys;
  }
  auto as_int64_rows = [&](const auto& structs, int64_t columns) {
    std::vector<int64_t> flat(structs.size() * static_cast<size_t>(columns));
    if (!structs.empty()) std::memcpy(flat.data(), structs.data(), flat.size() * sizeof(int64_t));
    return decode_support::upload(flat, device).view({static_cast<int64_t>(structs.size()), columns});
  };
  tables.blocks = as_int64_rows(layout.blocks, cuda_kernels::kBlockKeysFields);
  tables.tiles = as_int64_rows(layout.tiles, cuda_kernels::kKeyTileInt64s);
  return tables;
}

at::Tensor slot_weights(int64_t block_size, double gamma) {
  at::Tensor k = at::arange(block_size, at::kDouble);
  at::Tensor w = at::exp(-(k - 1) / gamma);
  w.index_put_({0}, 0.0);
  return w.to(at::kFloat);
}

}  // namespace dflash::drafter
