#!/usr/bin/env bash
# The disaggregated pipeline's measured forecast on the GPU machine: builds
# the host, writes a Qwen3-8B-shaped target with random weights (36 layers)
# and its config (scripts/pipeline_8b_setup.sh), then `dflash-host plan --calibrate` times the
# target's forward and the 8B drafter's step (5 layers, 512 anchors × 16 per
# 4,096-token row, fused_ckpt_kl, bf16) on the one GPU and forecasts every
# split of 4 and of 8 ranks (docs/distributed.md).
#   scripts/device/pipeline_forecast.sh [OUTDIR]     (carry .deps/debs)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/pipeline_forecast}}
work=${DFLASH_FORECAST_WORK:-/tmp/dflash_forecast}
mkdir -p "$out" "$work"
[ "${SKIP_BUILD:-0}" = 1 ] || DFLASH_DEVICE_NO_TESTS=1 "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1
config=$("$root/scripts/pipeline_8b_setup.sh" "$work")
host="$root/build-gpu/bin/dflash-host --no-default-plugin-dirs --plugin-dir $root/build-gpu/lib/dflash-host/plugins"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" || true
date -u +%Y-%m-%dT%H:%MZ > "$out/date.txt"
$host plan --config "$config" --target-ranks 2 --drafter-ranks 2 --calibrate 5 > "$out/forecast_4.txt" 2> "$out/forecast_4.log"
$host plan --config "$config" --target-ranks 2 --drafter-ranks 2 --calibrate 5 --json > "$out/forecast_4.json" 2>/dev/null
$host plan --config "$config" --target-ranks 4 --drafter-ranks 4 --set train.grad_accumulation=8 --calibrate 5 \
  > "$out/forecast_8.txt" 2> "$out/forecast_8.log"
sed -n '/^throughput/,$p' "$out/forecast_4.txt" "$out/forecast_8.txt"
