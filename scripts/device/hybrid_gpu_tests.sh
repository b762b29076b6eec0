#!/usr/bin/env bash
# A short GPU call for issue 39 (after a change to either HF target): builds
# the two target plugins, their tests and hybrid_bench; runs delta_rule_tests
# (the delta rule's CUDA kernels against its ATen form) and every GPU test
# of target_tests and hybrid_target_tests; then the delta rule alone, ours
# beside flash-linear-attention's kernel in the same run (when .ref/fla_pkg
# is carried). Writes OUTDIR/tests.log and OUTDIR/rule.txt.
#   scripts/device/hybrid_gpu_tests.sh OUTDIR      # carry .deps/debs (and .ref/fla_pkg)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device/hybrid_gpu_tests.sh OUTDIR}
mkdir -p "$out"
cd "$root"
build="${DFLASH_DEVICE_BUILD_DIR:-$root/build-gpu}"
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host dflash_target_hf_hybrid dflash_target_hf_decoder delta_rule_tests hybrid_target_tests target_tests hybrid_bench" \
  scripts/device/build.sh > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
{
  echo "# $(date -u) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader)"
  "$build/bin/delta_rule_tests"
  "$build/bin/target_tests" --gtest_filter='*Gpu*:*Cuda*'
  "$build/bin/hybrid_target_tests" --gtest_filter='*Gpu*:*Cuda*'
} > "$out/tests.log" 2>&1
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|^\[  FAILED" "$out/tests.log"
{
  echo "# $(date -u) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader)"
  fla=(); [ -d .ref/fla_pkg/fla ] && fla=(--fla "$root/.ref/fla_pkg")
  python3 bench/hybrid_forward_transformers.py --skip-model "${fla[@]}" 2>&1 | grep '^{'
  "$build/bin/hybrid_bench" --plugin-dir "$build/lib/dflash-host/plugins"
} 2>&1 | tee "$out/rule.txt"
