#!/usr/bin/env bash
# Where hf_hybrid's decoding time goes on the GPU (issue 39, point 7's demo
# waits on it: ~22 ms a step at batch 256 on the tiny qwen3_5_wide fixture).
# Carry .deps/debs.   scripts/device.sh hybrid_decode_profile OUTDIR
#   0. delta_rule_tests and hybrid_target_tests (their GPU cases);
#   1. decode_bench --target hf_hybrid: target-only greedy decoding at batch
#      1 (ms a token, the phases) with a Chrome trace, read by
#      scripts/trace_gaps.py (device busy vs waiting, and on which host op)
#      and scripts/trace_kernels.py (device time by kernel);
#   2. `dflash-host generate` at batch 1, 16 and 256 (decode ms a step, prefill
#      ms a prompt), and at 256 under Nsight Systems where the machine has it
#      and DFLASH_PROFILE_NSYS is not 0 (its kernel and CUDA API tables).
# Everything lands in OUTDIR/0_all.tgz (a device call returns only the first
# few files of a folder).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device.sh hybrid_decode_profile OUTDIR}
mkdir -p "$out"
cd "$root"
b=build-gpu
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host dflash_target_hf_hybrid dflash_data_jsonl dflash_drafter_dflash dflash_loss_fused_ckpt_kl dflash_scheduler_warmup_cosine decode_bench delta_rule_tests hybrid_target_tests" \
  scripts/device/build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
fixture=tests/fixtures/hf_hybrid/qwen3_5_wide
# 0. The hybrid target's GPU tests (the plan upload through pinned memory).
timeout 240 $b/bin/delta_rule_tests > "$out/delta_rule_tests.log" 2>&1; tail -3 "$out/delta_rule_tests.log"
timeout 240 $b/bin/hybrid_target_tests > "$out/hybrid_target_tests.log" 2>&1; tail -3 "$out/hybrid_target_tests.log"

# 1. Batch 1 through eval's greedy decoding, traced.
timeout 120 $b/bin/decode_bench --plugin-dir $b/lib/dflash-host/plugins --target hf_hybrid --model $fixture \
  --random-prompts --max-prompts 4 --prompt-tokens 24 --max-new-tokens 32 --trace "$out/trace" \
  --json "$out/decode_bench.json" > "$out/decode_bench.txt" 2>&1
python3 -c "
import json; r = json.load(open('$out/decode_bench.json'))
for arm in r['arms']: print(arm.get('arm'), json.dumps(arm.get('greedy', arm))[:400])" 2>&1 | tee "$out/decode_bench_summary.txt"
for t in "$out"/trace-*-greedy.json; do
  [ -f "$t" ] || continue
  python3 scripts/trace_gaps.py "$t" --top 12 > "$t.gaps.txt" 2>&1; head -30 "$t.gaps.txt"
  python3 scripts/trace_kernels.py "$t" --top 15 > "$t.kernels.txt" 2>&1; head -25 "$t.kernels.txt"
done

# 2. generate at three batch sizes; the largest under Nsight Systems too.
python3 scripts/hybrid_generate_setup.py /tmp/hg 256 "$root/$fixture"
for bs in 1 16 256; do
  timeout 120 $b/bin/dflash-host --plugin-dir $b/lib/dflash-host/plugins generate --config /tmp/hg/c.json \
    --prompts /tmp/hg/p.jsonl --out /tmp/hg/o.jsonl --max-new-tokens 32 --batch-size "$bs" \
    --report "$out/generate_$bs.json" > "$out/generate_$bs.log" 2>&1
  python3 -c "
import json; r = json.load(open('$out/generate_$bs.json')); d = r['seconds'] - r['prefill_seconds']
print('generate batch $bs: %.2f ms a decode step (%d steps), %.2f ms a prompt prefill' % (1e3 * d / r['decode_steps'], r['decode_steps'], 1e3 * r['prefill_seconds'] / r['prompts']))" 2>&1 | tee -a "$out/generate_summary.txt"
done
if [ "${DFLASH_PROFILE_NSYS:-1}" = "1" ] && command -v nsys > /dev/null; then
  timeout 180 nsys profile --stats=false -o "$out/gen256" --force-overwrite true \
    $b/bin/dflash-host --plugin-dir $b/lib/dflash-host/plugins generate --config /tmp/hg/c.json --prompts /tmp/hg/p.jsonl \
    --out /tmp/hg/o2.jsonl --max-new-tokens 32 --batch-size 256 > "$out/nsys.log" 2>&1
  nsys stats --report cuda_gpu_kern_sum --report cuda_api_sum --format csv -o "$out/gen256" "$out/gen256.nsys-rep" > "$out/nsys_stats.log" 2>&1
  for f in "$out"/gen256_cuda_gpu_kern_sum.csv "$out"/gen256_cuda_api_sum.csv; do [ -f "$f" ] && head -14 "$f" | cut -c1-200; done
  rm -f "$out/gen256.nsys-rep" "$out"/gen256.sqlite
else
  echo "no nsys on this machine" | tee "$out/nsys.log"
fi
tar czf "$out/0_all.tgz" -C "$out" --exclude 0_all.tgz . 2>/dev/null || true
