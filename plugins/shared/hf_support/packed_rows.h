// The documents of a packed training batch, resolved once for any HF target:
// input_ids [B, S], with optional position_ids (restarting at 0 per packed
// document) and document_ids. Without document_ids, a position id of 0 starts
// a document; without either, each row is one document.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include <cstdint>

namespace dflash::hf {

struct PackedRows {
  at::Tensor ids;        // [B, S] int64, on the model's device
  at::Tensor documents;  // [B, S] int64; undefined when each row is one document
  at::Tensor starts;     // [B, S] bool, true at a document's first token; undefined with `documents`
  at::Tensor positions;  // [B, S] int64: each token's position within its document
};

// Checks the batch (input_ids [B, S] with ids in [0, vocab_size); the other
// two, when given, of input_ids' shape) and throws std::invalid_argument
// saying what is wrong.
PackedRows resolve_packed_rows(const at::Tensor& input_ids, const at::Tensor& position_ids,
                               const at::Tensor& document_ids, int64_t vocab_size, const c10::Device& device);

// The additive [B, 1, S, S] mask (0 / −inf, in `options`' dtype) of causal
// attention within documents, for SDPA; none when every row is one document
// (plain causal attention then). Additive rather than boolean: both LibTorch
// versions accept it.
c10::optional<at::Tensor> document_causal_mask(const PackedRows& rows, const at::TensorOptions& options);

}  // namespace dflash::hf
