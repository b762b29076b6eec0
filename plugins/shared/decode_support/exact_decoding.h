// The `exact_decoding` setting the Hugging Face targets share (hf_decoder,
// hf_hybrid): incremental decoding steps of up to kernel_ops::kInvariantMaxRows
// tokens run row-invariant kernels, so a token verified inside a drafted block
// gets bitwise the numbers it gets decoded alone, and speculative decoding
// returns exactly the target's greedy tokens in bf16 too (docs/target.md,
// "Exact decoding"). Parsed once here; each target decides where it applies.
#pragma once

#include <string>

namespace dflash::decode_support {

// kAuto: wherever the kernels apply, the usual kernels elsewhere; kOn: the same,
// but the target refuses (at load or at the step) where they cannot apply;
// kOff: cuBLAS and flash attention, whose sums differ between 1 and 16 rows.
enum class ExactDecoding { kOff, kAuto, kOn };

// The schema's values ("auto", "on", "off"; the schema has checked them).
inline ExactDecoding parse_exact_decoding(const std::string& value) {
  return value == "on" ? ExactDecoding::kOn : value == "off" ? ExactDecoding::kOff : ExactDecoding::kAuto;
}

// The refusal of exact_decoding: on for a step (`call`) whose sessions of up
// to `capacity` tokens have more attention scores than shared memory holds.
inline std::string exact_decoding_capacity_refusal(const std::string& call, int64_t capacity) {
  return call + ": exact_decoding holds a session's attention scores in shared memory, which cannot take the pool's " +
         std::to_string(capacity) + " tokens per session on this device; use shorter sessions or exact_decoding: auto " +
         "(the usual kernels past that length)";
}

// The setting's description in a target's schema.
inline const char* exact_decoding_help() {
  return "incremental decoding on the GPU path: steps of up to 16 tokens run row-invariant kernels, so a token "
         "verified in a drafted block gets bitwise the logits it gets decoded alone and speculative decoding returns "
         "exactly the greedy tokens in bf16 too (docs/target.md). auto = wherever they apply (the GPU decoding path, "
         "widths in multiples of 8, no experts), the usual kernels elsewhere; on = the same, but an error where they "
         "cannot apply; off = cuBLAS and flash attention, whose sums differ between 1 and 16 rows";
}

}  // namespace dflash::decode_support
