#!/usr/bin/env bash
# Issue 43 on the GPU in one call: EAGLE-3 trained on the GPU, its export
# checked by SpecForge's reference model, its τ on the quickstart target.
#   scripts/device.sh eagle3_round OUTDIR     (carry .deps/debs and .ref)
#   1. builds what it needs (scripts/device/build.sh) and runs eagle3_tests;
#   2. on the quickstart target, in bf16 on the GPU: token counts, then an
#      EAGLE-3 drafter (draft vocabulary 200, 4 TTT steps, loss kl) for
#      DFLASH_EAGLE3_STEPS steps (default 300), then eval on 32 held-out prompts
#      (DFLASH_EAGLE3_EVAL=0 skips it);
#   3. eagle3_reference_dump of its last checkpoint in fp32 and in bf16, and
#      scripts/check_reference_eagle3.py against SpecForge's
#      LlamaForCausalLMEagle3 (.ref/eagle3: scripts/fetch_reference_eagle3.sh).
# OUTDIR gets summary.txt (the verdicts), the logs, check_*.json, the eval
# report and 0_all.tgz. Exit status 0 only when every check passed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device.sh eagle3_round OUTDIR}
steps=${DFLASH_EAGLE3_STEPS:-300}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
pack() { tar czf "$out/0_all.tgz" -C "$out" --exclude 0_all.tgz . 2>/dev/null || true; }
[ -f "$root/.ref/eagle3/specforge/modeling/draft/llama3_eagle.py" ] ||
  { say "missing .ref/eagle3: run scripts/fetch_reference_eagle3.sh GIT_DIR on the CPU machine and carry .ref"; exit 2; }
b="$root/build-gpu"
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host eagle3_tests eagle3_reference_dump dflash_drafter_eagle3 \
dflash_target_hf_decoder dflash_data_jsonl dflash_loss_kl dflash_scheduler_warmup_cosine" \
  "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; pack; exit 1; }
say "built at ${SECONDS} s on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
"$b/bin/eagle3_tests" > "$out/eagle3_tests.log" 2>&1; say "eagle3_tests: $(tail -1 "$out/eagle3_tests.log")"

host=("$b/bin/dflash-host" --no-default-plugin-dirs --plugin-dir "$b/lib/dflash-host/plugins")
work=/tmp/eagle3_round
rm -rf "$work" && mkdir -p "$work"
gpu=(--set train.device=cuda --set train.dtype=bfloat16)
eagle3=(--drafter eagle3 --set "drafter.token_counts=$work/counts.json" --set drafter.draft_vocab_size=200
  --set drafter.ttt_steps=4 --loss kl)
cd "$root"
"${host[@]}" token-counts --config configs/quickstart.json "${eagle3[@]}" --out "$work/counts.json" > "$out/token_counts.log" 2>&1
"${host[@]}" train --config configs/quickstart.json "${eagle3[@]}" "${gpu[@]}" --set "train.steps=$steps" \
  --set train.eval_every=0 --set "train.checkpoint_every=$steps" --set "train.output_dir=$work/run" > "$out/train.log" 2>&1
say "train: exit $?, $(grep -c '^step' "$out/train.log" 2>/dev/null) step lines, at ${SECONDS} s"
if [ "${DFLASH_EAGLE3_EVAL:-1}" = "1" ]; then  # 0: the export check alone, for a short call
  "${host[@]}" eval --config configs/quickstart.json "${eagle3[@]}" "${gpu[@]}" --drafter-checkpoint "$work/run" \
    --prompts configs/quickstart/data/heldout.jsonl --max-prompts 32 --report "$out/eval_eagle3.json" > "$out/eval.log" 2>&1
  say "eval: $(grep -E 'tau|identical' "$out/eval.log" | head -2 | tr '\n' ' ')"
fi
checkpoint=$(ls -d "$work"/run/checkpoints/step-* 2>/dev/null | tail -1)
status=0
for dtype in float32 bfloat16; do
  "$b/bin/eagle3_reference_dump" --checkpoint "$checkpoint" --out "$work/dump_$dtype.safetensors" --dtype "$dtype" \
    --device cuda --rows 2 --length 61 > "$out/dump_$dtype.log" 2>&1 || { say "dump $dtype failed: $(tail -1 "$out/dump_$dtype.log")"; status=1; continue; }
  python3 scripts/check_reference_eagle3.py --specforge .ref/eagle3 --drafter "$checkpoint" --dump "$work/dump_$dtype.safetensors" \
    --device cuda --json "$out/check_$dtype.json" > "$out/check_$dtype.log" 2>&1 || status=1
  say "$(tail -1 "$out/check_$dtype.log")"
done
cp "$checkpoint/config.json" "$out/exported_config.json" 2>/dev/null || true
say "SpecForge $(cat .ref/eagle3/COMMIT 2>/dev/null); done at ${SECONDS} s"
pack
exit $status
