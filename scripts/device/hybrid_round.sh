#!/usr/bin/env bash
# One GPU call after a change to hf_hybrid or its kernels (issue 39): builds
# what it needs, runs the kernels' and the hybrid target's GPU tests, the
# forward bench beside transformers (scripts/device/hybrid_bench.sh), a
# generate of 1024 prompts on the tiny qwen3_5_wide fixture (decode steps per
# second), and Nsight Compute on the delta rule's kernels. Carry .deps/debs
# and .ref/fla_pkg.   scripts/device/hybrid_round.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: scripts/device/hybrid_round.sh OUTDIR}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
b=build-gpu; DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host dflash_target_hf_hybrid dflash_data_jsonl dflash_drafter_dflash dflash_loss_fused_ckpt_kl dflash_scheduler_warmup_cosine delta_rule_tests hybrid_target_tests hybrid_bench" scripts/device/build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
{ nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; $b/bin/delta_rule_tests; $b/bin/hybrid_target_tests --gtest_filter='*Gpu*:*Cuda*'; } > $OUT/tests.log 2>&1; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/tests.log
PROFILE=8 SKIP_BUILD=1 timeout 300 scripts/device/hybrid_bench.sh $OUT/b > /dev/null 2>&1; grep -E "^hf_hybrid|^delta|^ +[0-9.]+ +[0-9.]+%" $OUT/b/bench.txt | head -24 | cut -c1-150; grep -o '"arm": "[^"]*", "median_ms": [0-9.]*' $OUT/b/bench.txt
python3 scripts/hybrid_generate_setup.py /tmp/g 1024 tests/fixtures/hf_hybrid/qwen3_5_wide
timeout 60 $b/bin/dflash-host --plugin-dir $b/lib/dflash-host/plugins generate --config /tmp/g/c.json --prompts /tmp/g/p.jsonl --out /tmp/g/o.jsonl --max-new-tokens 64 --batch-size 256 --report $OUT/generate.json > $OUT/generate.log 2>&1; grep -o '"decode_steps[^,]*\|"seconds[^,]*\|"tokens_per_s[^,]*' $OUT/generate.json
timeout 90 ncu --clock-control none -k regex:delta_ --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis $b/bin/hybrid_bench --plugin-dir $b/lib/dflash-host/plugins > $OUT/ncu.txt 2>&1; grep -E "Duration|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Block Limit" $OUT/ncu.txt | head -30
# A device call returns only the first few files of $OUT (by name): all of
# them, packed, come first.
tar czf "$OUT/0_all.tgz" -C "$OUT" --exclude 0_all.tgz . 2>/dev/null || true
