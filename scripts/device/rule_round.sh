#!/usr/bin/env bash
# Issue 39's delta rule in one short device call: builds the rule's tests and
# bench, runs delta_rule_tests (the kernels against the ATen form), the rule
# alone (hybrid_bench without --model, Kineto profile of 4 kernels), FLA's
# chunk_gated_delta_rule on the same shape, and Nsight Compute on our two
# kernels. Everything lands in $OUT/0_all.tgz.
#   bash scripts/device/rule_round.sh      (carry .deps/debs and .ref/fla_pkg)
set -uo pipefail
cd "$(dirname "$0")/../.."
k=/tmp/k; mkdir -p $k
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host delta_rule_tests hybrid_bench" scripts/device/build.sh > $k/build.log 2>&1 || { tail -30 $k/build.log; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader
build-gpu/bin/delta_rule_tests > $k/tests.log 2>&1; grep -E "^\[ +(OK|PASSED|FAILED) |Failure|Expected|Which|actual" $k/tests.log | head -30
build-gpu/bin/hybrid_bench --plugin-dir build-gpu/lib/dflash-host/plugins --profile 4 > $k/bench.txt 2>&1; tail -8 $k/bench.txt
python3 bench/hybrid_forward_transformers.py --fla .ref/fla_pkg --skip-model > $k/fla.txt 2>&1; grep -v -i warn $k/fla.txt | tail -4
timeout 100 ncu --clock-control none -k regex:delta_ --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats build-gpu/bin/hybrid_bench --plugin-dir build-gpu/lib/dflash-host/plugins > $k/ncu.txt 2>&1; grep -E "delta_|Duration|Registers Per|Warp Cycles Per Issued|Achieved Occupancy" $k/ncu.txt
tar czf "$OUT/0_all.tgz" -C /tmp k  # a device call returns only the first few files of $OUT
