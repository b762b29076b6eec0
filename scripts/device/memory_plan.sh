#!/usr/bin/env bash
# The memory planner's accuracy on the GPU machine, one command: builds (the
# planner's tests run there too), writes 27B-wide and 8B-wide 5-layer target
# checkpoints (scripts/make_wide_target.py), then compares `dflash-host plan`
# with the allocator's measured peak over real training steps, and records
# the out-of-memory report of a configuration that does not fit.
#   scripts/device/memory_plan.sh [OUTDIR]     (carry .deps/debs)
#   SKIP_BUILD=1 to reuse build-gpu/; OOM_ONLY=1 for the out-of-memory demonstration alone;
#   ONLY="REGEX" for the cases whose names it finds (scripts/memory_accuracy.py;
#   ONLY=EAGLE-3: the eagle3 drafter's plan alone)
#   GRID=1 for the grid of small shapes instead (issue 40, item 8: the GPU demonstration's
#   drafter and its neighbours, and a small target of the block kernel's head shape)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/memory_plan}}
work=${DFLASH_MEMORY_WORK:-/tmp/dflash_memory}
mkdir -p "$out" "$work"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  "$root/scripts/device/build.sh" -R "MemoryPlan|PlanCommand|OutOfMemory|DFlashDrafter|AdamW" > "$out/build_and_tests.txt" 2>&1 || true
  grep -E "tests passed|FAILED|Failed|error:" "$out/build_and_tests.txt" | head -40 || true
fi
if [ -n "${GRID:-}" ]; then
  [ -f "$work/demo/model.safetensors" ] || python3 "$root/scripts/make_wide_target.py" "$work/demo" --preset gpu-demo --layers 8
  [ -f "$work/small128/model.safetensors" ] || python3 "$root/scripts/make_wide_target.py" "$work/small128" --preset small-128 --layers 5
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$out/gpu.txt" || true
  python3 "$root/scripts/memory_accuracy.py" --host "$root/build-gpu/bin/dflash-host --no-default-plugin-dirs --plugin-dir $root/build-gpu/lib/dflash-host/plugins" \
    --work "$work" --out "$out" --grid ${ONLY:+--only "$ONLY"}
  cat "$out/memory_accuracy.md"
  exit 0
fi
[ -f "$work/q27/model.safetensors" ] || python3 "$root/scripts/make_wide_target.py" "$work/q27" --preset qwen3.6-27b
# The 8B-wide target only where a chosen case uses it (ONLY is a regular expression over the cases' names).
needs_q8=1
[ -z "${OOM_ONLY:-}" ] || needs_q8=0
[ -z "${ONLY:-}" ] || python3 -c 'import re, sys; sys.exit(0 if re.search(sys.argv[1], "8B-wide") or re.search(sys.argv[1], "EAGLE-3, 8B-wide") else 1)' "$ONLY" || needs_q8=0
[ "$needs_q8" = 0 ] || [ -f "$work/q8/model.safetensors" ] || python3 "$root/scripts/make_wide_target.py" "$work/q8" --preset qwen3-8b
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$out/gpu.txt" || true
python3 "$root/scripts/memory_accuracy.py" --host "$root/build-gpu/bin/dflash-host --no-default-plugin-dirs --plugin-dir $root/build-gpu/lib/dflash-host/plugins" \
  --work "$work" --out "$out" ${ONLY:+--only "$ONLY"} ${OOM_ONLY:+--oom-only}
[ -f "$out/memory_accuracy.md" ] && cat "$out/memory_accuracy.md"
