#!/usr/bin/env bash
# Builds the safetensors header fuzz target with clang's libFuzzer (plus
# AddressSanitizer and UBSan) and runs it from the seed corpus.
#   scripts/fuzz_safetensors.sh [seconds, default 60]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="${DFLASH_FUZZ_DIR:-$root/build-fuzz}"
mkdir -p "$out/corpus"
cp -n "$root"/tests/sdk/fuzz/corpus/* "$out/corpus/" 2>/dev/null || true
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/sdk/include" "$root/tests/sdk/fuzz/safetensors_header_fuzz.cpp" -o "$out/safetensors_header_fuzz"
"$out/safetensors_header_fuzz" -max_total_time="${1:-60}" -max_len=4096 "$out/corpus"
