#!/usr/bin/env bash
# Issue 41 in one device call: the GPU tests of the draft-tree paths (exact
# tree steps and their graphs, the drafter's graphed top-k, the tiled
# invariant linear, the chain's exact decoding beside them), then the GPU
# demonstration with its tree sweep (stage 4d) and the tree step's profile.
#   scripts/device/tree_round.sh [OUTDIR]      (carry .deps/debs and .corpus)
# The demo runs shortened to fit one 10-minute call with the build and the
# tests (its DFLASH_DEMO_* settings below; any set in the environment win).
# TREE_ROUND_TESTS=0 skips the GPU tests (and their build) but for the
# invariant linear's own test and kernel_bench at the scale model's shapes
# (kernel_bench_scale.txt; TREE_ROUND_KERNELS=0 skips both). The sweep on the
# scale model (stage 4f) instead of the demo target's own:
#   TREE_ROUND_TESTS=0 DFLASH_DEMO_SCALE=16 DFLASH_DEMO_TREE_NODES= DFLASH_DEMO_TARGET_SECONDS=45 \
#     scripts/device.sh tree_round "$OUT"
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/tree_round}}
mkdir -p "$out"
date -u +%Y-%m-%dT%H:%MZ > "$out/machine.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$out/machine.txt" 2>&1 || true
tests=${TREE_ROUND_TESTS:-1}
test_targets=""; [ "$tests" = 1 ] && test_targets="target_tests drafter_tests eval_tests"
kernels=${TREE_ROUND_KERNELS:-1}
[ "$kernels" = 1 ] && test_targets="$test_targets invariant_linear_tests kernel_bench"
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host decode_bench $test_targets \
dflash_target_hf_decoder dflash_drafter_dflash dflash_drafter_prompt_lookup dflash_data_jsonl dflash_data_synthetic \
dflash_loss_fused_ckpt_kl dflash_scheduler_constant dflash_scheduler_warmup_cosine" \
  "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
bin="$root/build-gpu/bin"
[ "$tests" = 1 ] && {
  "$bin/target_tests" --gtest_filter='HfDecoder.*Exact*:HfDecoder.*Stream*:HfDecoder.CudaKernels*'
  "$bin/drafter_tests" --gtest_filter='DFlashFusedDrafting.*'
  "$bin/eval_tests" --gtest_filter='Tree*:DraftTree*'
} 2>&1 | grep -v "\[info\]" > "$out/gpu_tests.txt"
[ "$tests" = 1 ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Z]" "$out/gpu_tests.txt"
[ "$kernels" = 1 ] && {
  "$bin/invariant_linear_tests" 2>&1 | grep -v "\[info\]" > "$out/invariant_linear_tests.txt"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Z]" "$out/invariant_linear_tests.txt"
  # The scale model's projections (DFLASH_DEMO_SCALE=16 on the demo target).
  "$bin/kernel_bench" --hidden 8192 --intermediate 24576 --heads 32 --kv-heads 16 --head-dim 64 --vocab 8192 \
    --iters 20 --json "$out/kernel_bench_scale.json" > "$out/kernel_bench_scale.txt" 2>&1
  cat "$out/kernel_bench_scale.txt"
}
export DFLASH_DEMO_SKIP_BUILD=1
export DFLASH_DEMO_TARGET_SECONDS="${DFLASH_DEMO_TARGET_SECONDS:-60}"
export DFLASH_DEMO_GENERATE_PROMPTS="${DFLASH_DEMO_GENERATE_PROMPTS:-12288}"
export DFLASH_DEMO_DRAFTER_MAX_SECONDS="${DFLASH_DEMO_DRAFTER_MAX_SECONDS:-150}"
export DFLASH_DEMO_DRAFTER_STEPS="${DFLASH_DEMO_DRAFTER_STEPS:-1700}"
export DFLASH_DEMO_USUAL_KERNELS="${DFLASH_DEMO_USUAL_KERNELS:-0}"
export DFLASH_DEMO_TRAIN_EVAL_PROMPTS="${DFLASH_DEMO_TRAIN_EVAL_PROMPTS:-0}"
OUT="$out" "$root/scripts/gpu_demo.sh" > "$out/demo_stdout.txt" 2>&1
echo "demo exit $?"
cat "$out/summary.md" 2>/dev/null
# A device call returns only the first few files of $OUT (by name): all of
# them, packed, come first.
tar czf "$out/0_all.tgz" -C "$out" --exclude 0_all.tgz . 2>/dev/null || true
