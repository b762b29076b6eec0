#!/usr/bin/env bash
# The disaggregated pipeline's measured forecast on the GPU machine: builds
# the host, writes a Qwen3-8B-shaped target with random weights (36 layers,
# scripts/make_wide_target.py), then `dflash-host plan --calibrate` times the
# target's forward and the 8B drafter's step (5 layers, 512 anchors × 16 per
# 4,096-token row, fused_ckpt_kl, bf16) on the one GPU and forecasts every
# split of 4 and of 8 ranks (docs/distributed.md).
#   scripts/device_pipeline_forecast.sh [OUTDIR]     (carry .deps/debs)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-/tmp/pipeline_forecast}}
work=${DFLASH_FORECAST_WORK:-/tmp/dflash_forecast}
mkdir -p "$out" "$work"
[ "${SKIP_BUILD:-0}" = 1 ] || DFLASH_DEVICE_NO_TESTS=1 "$root/scripts/device_build.sh" > "$out/build.txt" 2>&1
[ -f "$work/q8/model.safetensors" ] || python3 "$root/scripts/make_wide_target.py" "$work/q8" --preset qwen3-8b --layers 36
cat > "$work/forecast.json" <<JSON
{
  "train": {"device": "cuda", "dtype": "bfloat16", "steps": 100, "grad_accumulation": 4, "output_dir": "$work/run"},
  "data": {"plugin": "synthetic", "vocab_size": 0, "row_length": 4096, "tokens_per_batch": 4096},
  "target": {"plugin": "hf_decoder", "path": "$work/q8"},
  "drafter": {"plugin": "dflash", "num_layers": 5, "block_size": 16, "max_anchors": 512},
  "loss": {"plugin": "fused_ckpt_kl", "kl_weight": 0.5},
  "scheduler": {"plugin": "constant"}
}
JSON
host="$root/build-gpu/bin/dflash-host --no-default-plugin-dirs --plugin-dir $root/build-gpu/lib/dflash-host/plugins"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" || true
date -u +%Y-%m-%dT%H:%MZ > "$out/date.txt"
$host plan --config "$work/forecast.json" --target-ranks 2 --drafter-ranks 2 --calibrate 5 > "$out/forecast_4.txt" 2> "$out/forecast_4.log"
$host plan --config "$work/forecast.json" --target-ranks 2 --drafter-ranks 2 --calibrate 5 --json > "$out/forecast_4.json" 2>/dev/null
$host plan --config "$work/forecast.json" --target-ranks 4 --drafter-ranks 4 --set train.grad_accumulation=8 --calibrate 5 \
  > "$out/forecast_8.txt" 2> "$out/forecast_8.log"
sed -n '/^throughput/,$p' "$out/forecast_4.txt" "$out/forecast_8.txt"
