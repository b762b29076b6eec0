#!/usr/bin/env bash
# The drafter-step benchmark on the GPU machine, one command: builds, runs the
# whole test suite on the GPU, then bench/drafter_bench.cpp at the
# Qwen3.6-27B drafter shape in the configurations docs/performance.md reports.
#   scripts/device/drafter_bench.sh [OUTDIR]       (carry .deps/debs)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/drafter_bench}}
mkdir -p "$out"
"$root/scripts/device/build.sh" > "$out/build_and_tests.txt" 2>&1 || true
grep -E "tests passed|FAILED|Failed|error:" "$out/build_and_tests.txt" | head -40 || true
bench="$root/build-gpu/bin/drafter_bench --plugin-dir $root/build-gpu/lib/dflash-host/plugins --json $out/drafter_bench.jsonl"
run() {
  echo "== drafter_bench $*" | tee -a "$out/drafter_bench.txt"
  $bench "$@" 2>&1 | grep -v "^frame #" | tee -a "$out/drafter_bench.txt" || echo "bench run failed" | tee -a "$out/drafter_bench.txt"
}
# The peer's three shapes; default settings (grouped attention, bf16 states).
run
run --context 8192 --anchors 1024 --block 16
run --context 3072 --anchors 1024 --block 32
# Variants at 4096 / 512 × 16.
run --precision fp32_master
run --checkpointing
run --attention-kernel sdpa
run --group-blocks 16
run --group-blocks 64
run --attention dense
