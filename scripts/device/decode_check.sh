#!/usr/bin/env bash
# One GPU call that checks and times the decoding path (docs/performance.md,
# "Decoding at batch 1"):
#   1. builds into build-gpu (scripts/device/build.sh, tests skipped there);
#   2. runs the decoding tests on the GPU: graphs and flash decoding against
#      the eager kernels and the ATen path, flash drafting and its graph,
#      batched decoding on the kernels (ctest -R below: the tests with a GPU
#      case; the CPU-only decoding tests run in CI and took 4-5 of the call's
#      minutes here. DFLASH_DECODE_TESTS='regex' picks others;
#      DFLASH_DECODE_ALL_TESTS=1 runs the whole suite);
#   3. bench/decode_bench.cpp on random-weight targets: the gpu demo's shape
#      (8 layers, hidden 512, vocab 8192) with a random 2-layer drafter, block
#      16, and (DFLASH_DECODE_8B=1, the default) a Qwen3-8B shape, 36 layers.
# Run from the repo root, carrying .deps/debs:  scripts/device/decode_check.sh
# Writes to $OUT (or runs/decode-check): check.log, decode_demo_shape_{8,12}.json (DFLASH_DECODE_DEMO_LAYERS),
# decode_qwen3_8b.json.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out="${OUT:-$root/runs/decode-check}"
work=/tmp/decode-check
mkdir -p "$out" "$work"
log="$out/check.log"
: >"$log"
step() { echo "=== $* ($(date +%T))" | tee -a "$log"; }

step "build"
DFLASH_DEVICE_SKIP_TESTS=1 "$root/scripts/device/build.sh" >>"$log" 2>&1 || { echo "build failed (see $log)"; tail -40 "$log"; exit 1; }
build="${DFLASH_DEVICE_BUILD_DIR:-$root/build-gpu}"
plugins="$build/lib/dflash-host/plugins"

step "tests"
if [ "${DFLASH_DECODE_ALL_TESTS:-0}" = "1" ]; then
  ctest --test-dir "$build" -j 8 --output-on-failure >>"$log" 2>&1
else
  ctest --test-dir "$build" -j 4 --output-on-failure \
    -R "${DFLASH_DECODE_TESTS:-Cuda|Gpu|TargetDecoding|DFlashDrafter|DFlashFusedDrafting|TorchCompat}" >>"$log" 2>&1
fi
tests=$?
grep -E "tests passed|tests failed|\(Failed\)|\(SEGFAULT\)|\(Timeout\)|Not Run" "$log" | tail -20

for layers in ${DFLASH_DECODE_DEMO_LAYERS:-8 12}; do
step "decode_bench: the demo's shape with $layers layers (random weights), random 2-layer drafter, block 16"
python3 "$root/bench/make_random_qwen3.py" "$work/demo_shape_$layers" --layers "$layers" --hidden 512 --heads 8 --kv-heads 4 \
  --head-dim 64 --intermediate 1536 --vocab 8192 >>"$log" 2>&1
"$build/bin/decode_bench" --plugin-dir "$plugins" --model "$work/demo_shape_$layers" --random-drafter 2 --block-size 16 \
  --random-prompts --prompt-tokens 64 --max-prompts 8 --max-new-tokens 128 --json "$out/decode_demo_shape_$layers.json" \
  >/dev/null 2>>"$log"
python3 - "$out/decode_demo_shape_$layers.json" <<'PY' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1]))
for a in r["arms"]:
    g, s = a["greedy"], a.get("speculative", {})
    print(f'{a["arm"]:7s} greedy {g["ms_per_token"]:.3f} ms/token ({g["tokens_per_s"]:.0f}/s)  '
          f'spec {s.get("ms_per_step", 0):.3f} ms/step tau {s.get("tau", 0):.2f} '
          f'phases/step {json.dumps({k: round(v, 3) for k, v in s.get("profiled_ms_per_step", {}).items()})}  '
          f'graphs {json.dumps(a["target"]["decode_graph_stats"])}')
PY
done

if [ "${DFLASH_DECODE_8B:-1}" = "1" ]; then
  step "decode_bench: Qwen3-8B shape (random weights, 36 layers), random 1-layer drafter, block 16"
  python3 "$root/bench/make_random_qwen3.py" "$work/qwen3_8b" --layers 36 --hidden 4096 --heads 32 --kv-heads 8 \
    --head-dim 128 --intermediate 12288 --vocab 151936 >>"$log" 2>&1
  "$build/bin/decode_bench" --plugin-dir "$plugins" --model "$work/qwen3_8b" --random-drafter 1 --block-size 16 \
    --random-prompts --prompt-tokens 128 --max-prompts 4 --max-new-tokens 64 --arms graphs,eager \
    --json "$out/decode_qwen3_8b.json" >/dev/null 2>>"$log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [print(a['arm'], json.dumps(a['greedy']), json.dumps(a.get('speculative',{}).get('profiled_ms_per_step',{}))) for a in r['arms']]" \
    "$out/decode_qwen3_8b.json" | tee -a "$log"
fi
step "done (tests exit $tests)"
exit $tests
