#!/usr/bin/env bash
# The drafter's fused layer ops on the GPU machine, one command: builds the
# host, drafter_bench and the drafter's and trainer's tests only, runs the GPU
# tests of the kernels and of the drafter (fused against op by op, forward and
# backward; grouped attention keeping calls or rows; AdamW with a clip
# factor), then drafter_bench with --layer-ops fused and aten in the same run,
# at each shape.
#   scripts/device/layer_ops.sh [OUTDIR]      (carry .deps/debs)
#   SHAPES="4096:512:16 8192:1024:16 3072:1024:32" (context:anchors:block; default the first)
#   BENCH_ARGS="--precision fp32_master" adds flags to every bench run
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/layer_ops}}
mkdir -p "$out"
# Only the targets this needs: a few minutes less than the whole build.
if ! DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host drafter_bench drafter_tests train_tests" \
    "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1; then
  grep -E "error|Error" "$out/build.txt" | head -40
  exit 1
fi
{
  "$root/build-gpu/bin/drafter_tests" --gtest_filter='DFlashDrafter.*:TrainableOps.*:DFlashFusedDrafting.*'
  "$root/build-gpu/bin/train_tests" --gtest_filter='AdamW.*'
} > "$out/gpu_tests.txt" 2>&1 || true
grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/gpu_tests.txt" | head -30 || true
bench="$root/build-gpu/bin/drafter_bench --plugin-dir $root/build-gpu/lib/dflash-host/plugins --json $out/drafter_bench.jsonl"
for shape in ${SHAPES:-4096:512:16}; do
  IFS=: read -r context anchors block <<< "$shape"
  for ops in fused aten; do
    echo "== drafter_bench --context $context --anchors $anchors --block $block --layer-ops $ops ${BENCH_ARGS:-}" | tee -a "$out/drafter_bench.txt"
    # shellcheck disable=SC2086
    $bench --context "$context" --anchors "$anchors" --block "$block" --layer-ops "$ops" ${BENCH_ARGS:-} 2>&1 |
      grep -v "^frame #" | tee -a "$out/drafter_bench.txt" || echo "bench run failed" | tee -a "$out/drafter_bench.txt"
  done
done
