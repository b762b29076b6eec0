#!/usr/bin/env bash
# Issue 44 once on the GPU machine: a short quickstart run on the GPU, killed
# and resumed, then its TensorBoard event file read by TensorBoard's own
# EventAccumulator (where the machine's Python has tensorboard) beside the
# independent reader of the tests; each compared with metrics.jsonl.
#   scripts/device.sh tensorboard_check OUTDIR     (carry .deps/debs)
# OUTDIR gets summary.txt (the verdicts), metrics.jsonl and the event file.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device.sh tensorboard_check OUTDIR}
mkdir -p "$out"
DFLASH_DEVICE_SKIP_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host dflash_target_hf_decoder dflash_drafter_dflash dflash_data_jsonl \
dflash_loss_fused_ckpt_kl dflash_scheduler_warmup_cosine" "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1 ||
  { tail -30 "$out/build.txt"; exit 1; }
host=("$root/build-gpu/bin/dflash-host" --no-default-plugin-dirs --plugin-dir "$root/build-gpu/lib/dflash-host/plugins")
run=/tmp/tensorboard_check/run
rm -rf /tmp/tensorboard_check
cd "$root"
common=(--config configs/quickstart.json --set train.device=cuda --set train.dtype=bfloat16 --set train.eval_every=0
  --set train.checkpoint_every=20 --set "train.output_dir=$run")
# 60 steps, killed in its third checkpoint (step 60, after step 59's record); resumed
# from the checkpoint of step 40 to 80, so steps 40 … 59 are written again.
DFLASH_FAULT_ABORT_IN_SAVE=3 "${host[@]}" train "${common[@]}" --set train.steps=60 > "$out/first.log" 2>&1
"${host[@]}" train "${common[@]}" --set train.steps=80 > "$out/resumed.log" 2>&1
cp "$run/metrics.jsonl" "$out/" && cp "$run"/events.out.tfevents.* "$out/"
events=$(ls "$run"/events.out.tfevents.* | head -1)
python3 - "$events" "$run/metrics.jsonl" > "$out/summary.txt" 2>&1 <<'PY'
import json, sys
events, metrics = sys.argv[1], sys.argv[2]
records = [json.loads(l) for l in open(metrics)]
steps = [r["step"] for r in records]
print(f"metrics.jsonl: {len(records)} records, steps {steps[0]}..{steps[-1]}, each once: {len(set(steps)) == len(steps)}")
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"EventAccumulator: not on this machine ({e})")
    sys.exit(0)
acc = EventAccumulator(events, size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()["scalars"]
loss = [(e.step, e.value) for e in acc.Scalars("loss")]
ok = [s for s, _ in loss] == steps and all(abs(v - r["loss"]) <= 1e-6 * max(1.0, abs(r["loss"])) for (_, v), r in zip(loss, records))
print(f"EventAccumulator: {len(tags)} scalar tags; 'loss' at {len(loss)} steps, equal to metrics.jsonl step by step: {ok}")
print("PASS" if ok else "FAIL")
PY
cat "$out/summary.txt"
