// libFuzzer target for the safetensors header parser: any byte string must
// either parse or raise FormatError — no crash, no hang, no sanitizer report.
//   scripts/fuzz_safetensors.sh [seconds]
#include <dflash/sdk/safetensors.hpp>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto header = dflash::sdk::safetensors::parse_header(data, size, "fuzz");
    // Offsets that passed must lie inside the input.
    for (const auto& t : header.tensors)
      if (header.data_start + t.end > size) __builtin_trap();
  } catch (const dflash::sdk::safetensors::FormatError&) {
  }
  return 0;
}
