#!/usr/bin/env bash
# The drafter-step benchmark on the GPU machine, one command: builds, runs the
# GPU tests of the drafter and the trainer, then bench/drafter_bench.cpp at the
# Qwen3.6-27B drafter shape in the configurations docs/performance.md reports.
#   scripts/device_drafter_bench.sh [OUTDIR]       (carry .deps/debs)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-/tmp/drafter_bench}}
mkdir -p "$out"
"$root/scripts/device_build.sh" -R "DFlash|Drafter|Train|HfDecoder|DataSources" 2>&1 | grep -E "tests passed|FAILED|Failed" || true
bench="$root/build-gpu/bin/drafter_bench --plugin-dir $root/build-gpu/lib/dflash-host/plugins --json $out/drafter_bench.jsonl"
$bench                                   2>&1 | tee -a "$out/drafter_bench.txt"
$bench --checkpointing                   2>&1 | tee -a "$out/drafter_bench.txt"
$bench --checkpointing --embedding-on-cpu 2>&1 | tee -a "$out/drafter_bench.txt"
$bench --checkpointing --precision fp32_master 2>&1 | tee -a "$out/drafter_bench.txt"
$bench --attention dense                 2>&1 | tee -a "$out/drafter_bench.txt"
$bench --context 8192 --anchors 1024 --block 16 --checkpointing 2>&1 | tee -a "$out/drafter_bench.txt"
$bench --context 3072 --anchors 1024 --block 32 --checkpointing 2>&1 | tee -a "$out/drafter_bench.txt"
