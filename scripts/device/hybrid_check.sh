#!/usr/bin/env bash
# Issue 39 on the GPU machine, one call:
#   scripts/device/hybrid_check.sh OUTDIR
# 1. FIXTURES="name,name" (optional): transformers makes those fixtures of
#    scripts/make_hybrid_fixtures.py straight into tests/fixtures/hf_hybrid, so the
#    tests below check against them; they come back as OUTDIR/fixtures.tgz
#    (the machine returns at most 8 files a call).
# 2. Builds the two HF target plugins and their tests against the wheel's
#    CUDA LibTorch and runs them (the GPU tests included).
# Needs .deps/debs carried (scripts/fetch_device_deps.sh).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device/hybrid_check.sh OUTDIR}
mkdir -p "$out"
cd "$root"
{ nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader; date -u; git rev-parse HEAD 2>/dev/null; } > "$out/machine.txt"
if [ -n "${FIXTURES:-}" ]; then
  python3 scripts/make_hybrid_fixtures.py tests/fixtures/hf_hybrid "$FIXTURES" > "$out/fixtures.log" 2>&1
  names=$(echo "$FIXTURES" | tr ',' ' ')
  # shellcheck disable=SC2086
  (cd tests/fixtures/hf_hybrid && tar -czf "$out/fixtures.tgz" $names manifest.json)
fi
# ONLY_HYBRID=1: the hybrid plugin and its tests alone.
targets="dflash-host dflash_target_hf_hybrid hybrid_target_tests"
[ "${ONLY_HYBRID:-0}" = "1" ] || targets="$targets dflash_target_hf_decoder target_tests"
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="$targets" scripts/device/build.sh > "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
build="${DFLASH_DEVICE_BUILD_DIR:-$root/build-gpu}"
"$build/bin/hybrid_target_tests" > "$out/hybrid_tests.log" 2>&1; hybrid=$?
decoder=skipped
[ -x "$build/bin/target_tests" ] && [ "${ONLY_HYBRID:-0}" != "1" ] && { "$build/bin/target_tests" > "$out/target_tests.log" 2>&1; decoder=$?; }
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |tests? from .* ran" "$out"/*tests.log
echo "hybrid_target_tests rc $hybrid, target_tests rc $decoder"
