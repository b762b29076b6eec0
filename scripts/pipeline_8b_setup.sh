#!/usr/bin/env bash
# The disaggregated pipeline's measurement setup at the Qwen3-8B shape, one
# definition for the scripts that use it (scripts/device/pipeline_forecast.sh,
# scripts/device/multi_gpu.sh): a Qwen3-8B-shaped target with random weights
# (36 layers, H 4096; scripts/make_wide_target.py, written once into WORK)
# and the config feeding it to the 8B drafter (5 layers, 512 anchors × 16 per
# 4,096-token row, fused_ckpt_kl at blend 0.5, bf16, 4 micro-batches a step).
#   scripts/pipeline_8b_setup.sh WORK    prints the config's path (WORK/pipeline_8b.json)
# Runs set what they need on top (--set train.steps=…, train.output_dir=…).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:?WORK}
mkdir -p "$work"
[ -f "$work/q8/model.safetensors" ] || python3 "$root/scripts/make_wide_target.py" "$work/q8" --preset qwen3-8b --layers 36 >&2
cat > "$work/pipeline_8b.json" <<JSON
{
  "train": {"device": "cuda", "dtype": "bfloat16", "steps": 100, "grad_accumulation": 4, "output_dir": "$work/run"},
  "data": {"plugin": "synthetic", "vocab_size": 0, "row_length": 4096, "tokens_per_batch": 4096},
  "target": {"plugin": "hf_decoder", "path": "$work/q8"},
  "drafter": {"plugin": "dflash", "num_layers": 5, "block_size": 16, "max_anchors": 512},
  "loss": {"plugin": "fused_ckpt_kl", "kl_weight": 0.5},
  "scheduler": {"plugin": "constant"}
}
JSON
echo "$work/pipeline_8b.json"
