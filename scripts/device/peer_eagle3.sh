#!/usr/bin/env bash
# Our EAGLE-3 step and SpecForge's, side by side in one run on the GPU
# machine (issue 43): at each shape, the peer first (its default teacher, full
# logits from the target head, then its compact teacher), then ours, whose
# ratios are to the peer's lines of the same call (eagle3_bench --peer).
#   scripts/device.sh peer_eagle3 OUTDIR     (carry .deps/debs and .ref)
# .ref/eagle3 holds the SpecForge modules the peer's step needs:
# scripts/fetch_reference_eagle3.sh GIT_DIR on the CPU machine first.
# SHAPES="llama3-8b qwen3-8b" (default both), CONTEXT (default 2048),
# PEER_TEACHERS (default "logits compact"), OURS_LOSSES (default "kl fused_ckpt_kl"; the first also with --layer-ops
# aten --attention-kernel chunked, the op-by-op ATen reference), NO_PEER=1
# (ours only). eagle3_tests runs first (its GPU test checks the flash path).
# OUTDIR gets build.txt, machine.txt, steps.txt (every printed line, shape by
# shape) and steps.jsonl (ours: eagle3_bench's records; the peer's have "who").
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device.sh peer_eagle3 OUTDIR}
context=${CONTEXT:-2048}
mkdir -p "$out"
[ -f "$root/.ref/eagle3/specforge/algorithms/eagle3/model.py" ] ||
  { echo "no .ref/eagle3 with the trainer's modules: run scripts/fetch_reference_eagle3.sh GIT_DIR and carry .ref" >&2; exit 2; }
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host eagle3_bench eagle3_tests dflash_drafter_eagle3 dflash_loss_kl dflash_loss_fused_ckpt_kl" \
  "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
{ date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv || true; } > "$out/machine.txt"
timeout 120 "$root/build-gpu/bin/eagle3_tests" > "$out/eagle3_tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$out/eagle3_tests.txt"
for shape in ${SHAPES:-llama3-8b qwen3-8b}; do
  if [ "${NO_PEER:-0}" != 1 ]; then
    for teacher in ${PEER_TEACHERS:-logits compact}; do
      echo "== peer $shape context $context teacher $teacher" >> "$out/steps.txt"
      timeout 300 python3 "$root/scripts/peer_eagle3_step.py" --specforge "$root/.ref/eagle3" --shape "$shape" \
        --context "$context" --teacher "$teacher" --json "$out/peer.jsonl" 2>&1 |
        grep -v -E "UserWarning|^ +(warnings\.warn|_warn_once)\(|ttt_length|print_with_rank" >> "$out/steps.txt" ||
        echo "peer $shape $teacher failed" >> "$out/steps.txt"
    done
  fi
  peer=(); [ -s "$out/peer.jsonl" ] && peer=(--peer "$out/peer.jsonl")
  losses=(${OURS_LOSSES:-kl fused_ckpt_kl})
  for arm in "${losses[@]/%/ fused auto}" "${losses[0]} aten chunked"; do
    set -- $arm
    echo "== ours $shape context $context loss $1 layer ops $2 attention $3" >> "$out/steps.txt"
    timeout 300 "$root/build-gpu/bin/eagle3_bench" --plugin-dir "$root/build-gpu/lib/dflash-host/plugins" --shape "$shape" \
      --context "$context" --loss "$1" --layer-ops "$2" --attention-kernel "$3" "${peer[@]}" --json "$out/steps.jsonl" 2>&1 |
      grep -v "\[info\] loading" >> "$out/steps.txt" || echo "ours $shape $arm failed" >> "$out/steps.txt"
  done
done
cat "$out/peer.jsonl" >> "$out/steps.jsonl" 2>/dev/null || true
grep -E "^==|^peer|^step|^vs|^useful|^phases|failed|Error|error" "$out/steps.txt"
