#!/usr/bin/env bash
# Issue 39, point 7 in one device call: the hybrid target's GPU tests and a
# profile of its decoding (scripts/device/hybrid_decode_profile.sh), then the
# GPU demonstration on a hybrid target (DFLASH_DEMO_TARGET_FAMILY=qwen3_5).
#   scripts/device.sh hybrid_demo_round OUTDIR     (carry .deps/debs and .corpus)
# The demo runs shortened to fit one 10-minute call with the build (its
# DFLASH_DEMO_* settings below; any set in the environment win), and is cut
# off in time to pack what it made: everything lands in OUTDIR/0_all.tgz
# (a device call returns only the first few files of a folder).
#   DFLASH_ROUND_PROFILE=0   the hybrid target's tests only, no decode profile
#   DFLASH_ROUND_FAMILY=qwen3  the demo on the dense target instead (like with like)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device.sh hybrid_demo_round OUTDIR}
call_seconds=${DFLASH_ROUND_SECONDS:-580}  # the device call's limit, less the packing
mkdir -p "$out"
pack() { tar czf "$out/0_all.tgz" -C "$out" --exclude 0_all.tgz . 2>/dev/null || true; }
date -u +%Y-%m-%dT%H:%MZ > "$out/machine.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$out/machine.txt" 2>&1 || true
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host decode_bench delta_rule_tests hybrid_target_tests \
dflash_target_hf_hybrid dflash_target_hf_decoder dflash_drafter_dflash dflash_drafter_eagle3 dflash_drafter_prompt_lookup dflash_data_jsonl \
dflash_loss_fused_ckpt_kl dflash_scheduler_warmup_cosine" \
  "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; pack; exit 1; }
echo "built at ${SECONDS} s"

# 1–2. The hybrid target's GPU tests and where its decoding time goes
# (scripts/device/hybrid_decode_profile.sh, its build already done here);
# DFLASH_ROUND_PROFILE=0: the hybrid target's tests alone.
if [ "${DFLASH_ROUND_PROFILE:-1}" = "1" ]; then
  bash "$root/scripts/device/hybrid_decode_profile.sh" "$out/profile"
  echo "profiled at ${SECONDS} s"
else
  mkdir -p "$out/profile"
  timeout 240 "$root/build-gpu/bin/hybrid_target_tests" > "$out/profile/hybrid_target_tests.log" 2>&1
  tail -3 "$out/profile/hybrid_target_tests.log"
fi
pack

# 3. The demonstration on a hybrid target, shortened (DFLASH_ROUND_DEMO=0: the
# tests and the profile only, for a call with little device time left).
[ "${DFLASH_ROUND_DEMO:-1}" = "1" ] || exit 0
# DFLASH_ROUND_FAMILY=qwen3: the dense demo with the same shortened settings,
# for a like-with-like row beside the hybrid one.
export DFLASH_DEMO_SKIP_BUILD=1 DFLASH_DEMO_TARGET_FAMILY="${DFLASH_ROUND_FAMILY:-qwen3_5}"
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
