#!/usr/bin/env bash
# Issue 39's speed figures on the GPU machine, one call (after
# scripts/device/hybrid_check.sh built build-gpu, or SKIP_BUILD=0 to build):
#   scripts/device/hybrid_bench.sh OUTDIR
# transformers' Qwen3.5 forward at the Qwen3.6-27B shape (8 layers, 8 × 4096,
# bf16) with its torch delta rule, then with flash-linear-attention's kernels
# when .ref/fla_pkg holds the fla package (carried, never committed: fetched
# from fla-org/flash-linear-attention with einops beside it); both delta rules
# alone; then our hybrid_bench on the same random weights. Writes
# OUTDIR/bench.jsonl (every arm) and OUTDIR/bench.txt (the printed lines).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device/hybrid_bench.sh OUTDIR}
mkdir -p "$out"
cd "$root"
build="${DFLASH_DEVICE_BUILD_DIR:-$root/build-gpu}"
model=${MODEL_DIR:-/tmp/hybrid27b_8layers}
if [ "${SKIP_BUILD:-1}" = "0" ] || [ ! -x "$build/bin/hybrid_bench" ]; then
  DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host dflash_target_hf_hybrid hybrid_bench" scripts/device/build.sh \
    > "$out/bench_build.log" 2>&1 || { tail -40 "$out/bench_build.log"; exit 1; }
fi
{
  echo "# $(date -u) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader)"
  python3 bench/hybrid_forward_transformers.py --save-dir "$model" 2>&1 | grep -v -i warn
  if [ -d .ref/fla_pkg/fla ]; then
    python3 bench/hybrid_forward_transformers.py --fla "$root/.ref/fla_pkg" 2>&1 | grep -v -i warn
  fi
  "$build/bin/hybrid_bench" --plugin-dir "$build/lib/dflash-host/plugins" --model "$model" --json "$out/ours.jsonl" \
    --profile "${PROFILE:-0}"
  "$build/bin/hybrid_bench" --plugin-dir "$build/lib/dflash-host/plugins" --model "$model" --documents 4 \
    --json "$out/ours_packed.jsonl"
} 2>&1 | tee "$out/bench.txt"
cat "$out"/ours*.jsonl >> "$out/bench.jsonl" 2>/dev/null; grep '^{' "$out/bench.txt" >> "$out/bench.jsonl"
rm -f "$out"/ours*.jsonl
