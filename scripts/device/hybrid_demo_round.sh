#!/usr/bin/env bash
# Issue 39, point 7 in one device call: the hybrid target's GPU tests, a short
# profile of its decoding (where a generate step's time goes), then the GPU
# demonstration on a hybrid target (DFLASH_DEMO_TARGET_FAMILY=qwen3_5).
#   scripts/device.sh hybrid_demo_round OUTDIR     (carry .deps/debs and .corpus)
# The demo runs shortened to fit one 10-minute call with the build (its
# DFLASH_DEMO_* settings below; any set in the environment win), and is cut
# off in time to pack what it made: everything lands in OUTDIR/0_all.tgz
# (a device call returns only the first few files of a folder).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device.sh hybrid_demo_round OUTDIR}
call_seconds=${DFLASH_ROUND_SECONDS:-580}  # the device call's limit, less the packing
mkdir -p "$out"
pack() { tar czf "$out/0_all.tgz" -C "$out" --exclude 0_all.tgz . 2>/dev/null || true; }
date -u +%Y-%m-%dT%H:%MZ > "$out/machine.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$out/machine.txt" 2>&1 || true
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host decode_bench delta_rule_tests hybrid_target_tests \
dflash_target_hf_hybrid dflash_target_hf_decoder dflash_drafter_dflash dflash_drafter_prompt_lookup dflash_data_jsonl \
dflash_loss_fused_ckpt_kl dflash_scheduler_warmup_cosine" \
  "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; pack; exit 1; }
b="$root/build-gpu"
plugins="$b/lib/dflash-host/plugins"
echo "built at ${SECONDS} s"

# 1. The hybrid target's GPU tests.
for t in delta_rule_tests hybrid_target_tests; do
  timeout 120 "$b/bin/$t" 2>&1 | grep -v "\[info\]" > "$out/$t.txt"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Z]" "$out/$t.txt"
done

# 2. Where a decoding step's time goes, on the tiny qwen3_5_wide fixture:
# batch 1 traced (device busy vs waiting; kernels), and generate at batch 256
# under Nsight Systems where the machine has it and DFLASH_ROUND_NSYS is not 0 (else plain).
fixture="$root/tests/fixtures/hf_hybrid/qwen3_5_wide"
timeout 60 "$b/bin/decode_bench" --plugin-dir "$plugins" --target hf_hybrid --model "$fixture" --random-prompts \
  --max-prompts 2 --prompt-tokens 24 --max-new-tokens 32 --trace "$out/trace" --json "$out/decode_bench.json" \
  > "$out/decode_bench.txt" 2>&1
for t in "$out"/trace-*-greedy.json; do
  [ -f "$t" ] || continue
  python3 "$root/scripts/trace_gaps.py" "$t" --top 12 > "$t.gaps.txt" 2>&1 && head -24 "$t.gaps.txt"
  python3 "$root/scripts/trace_kernels.py" "$t" --top 15 > "$t.kernels.txt" 2>&1 && head -20 "$t.kernels.txt"
done
python3 "$root/scripts/hybrid_generate_setup.py" /tmp/hg 256 "$fixture"
generate=("$b/bin/dflash-host" --plugin-dir "$plugins" generate --config /tmp/hg/c.json --prompts /tmp/hg/p.jsonl
  --out /tmp/hg/o.jsonl --max-new-tokens 32 --batch-size 256 --report "$out/generate_256.json")
if [ "${DFLASH_ROUND_NSYS:-1}" = "1" ] && command -v nsys > /dev/null; then
  timeout 90 nsys profile --stats=false -o "$out/gen256" --force-overwrite true "${generate[@]}" > "$out/generate_256.log" 2>&1
  nsys stats --report cuda_gpu_kern_sum --report cuda_api_sum --format csv -o "$out/gen256" "$out/gen256.nsys-rep" \
    > "$out/nsys_stats.log" 2>&1
  for f in "$out"/gen256_cuda_gpu_kern_sum.csv "$out"/gen256_cuda_api_sum.csv; do [ -f "$f" ] && head -14 "$f" | cut -c1-160; done
  rm -f "$out/gen256.nsys-rep" "$out"/gen256.sqlite
else
  timeout 60 "${generate[@]}" > "$out/generate_256.log" 2>&1
fi
python3 -c "
import json; r = json.load(open('$out/generate_256.json')); d = r['seconds'] - r['prefill_seconds']
print('generate batch 256: %.2f ms a decode step (%d steps), %.2f ms a prompt prefill' % (1e3 * d / r['decode_steps'], r['decode_steps'], 1e3 * r['prefill_seconds'] / r['prompts']))" 2>&1
echo "profiled at ${SECONDS} s"
pack

# 3. The demonstration on a hybrid target, shortened (DFLASH_ROUND_DEMO=0: the
# tests and the profile only, for a call with little device time left).
[ "${DFLASH_ROUND_DEMO:-1}" = "1" ] || exit 0
export DFLASH_DEMO_SKIP_BUILD=1 DFLASH_DEMO_TARGET_FAMILY=qwen3_5
export DFLASH_DEMO_TARGET_SECONDS="${DFLASH_DEMO_TARGET_SECONDS:-50}"
export DFLASH_DEMO_GENERATE_PROMPTS="${DFLASH_DEMO_GENERATE_PROMPTS:-1536}"
export DFLASH_DEMO_DRAFTER_MAX_SECONDS="${DFLASH_DEMO_DRAFTER_MAX_SECONDS:-130}"
export DFLASH_DEMO_DRAFTER_STEPS="${DFLASH_DEMO_DRAFTER_STEPS:-1500}"
export DFLASH_DEMO_EVAL_NEW_TOKENS="${DFLASH_DEMO_EVAL_NEW_TOKENS:-128}"
export DFLASH_DEMO_TRAIN_EVAL_PROMPTS="${DFLASH_DEMO_TRAIN_EVAL_PROMPTS:-0}"
export DFLASH_DEMO_TREE_NODES="${DFLASH_DEMO_TREE_NODES-}"
left=$((call_seconds - SECONDS))
echo "the demo gets ${left} s"
OUT="$out" timeout --signal=TERM --kill-after=5 "$left" "$root/scripts/gpu_demo.sh" > "$out/demo_stdout.txt" 2>&1
echo "demo exit $? at ${SECONDS} s"
grep "^== " "$out/demo.log" 2>/dev/null | tail -20
cat "$out/summary.md" 2>/dev/null
pack
