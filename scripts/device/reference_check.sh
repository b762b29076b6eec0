#!/usr/bin/env bash
# Does z-lab's reference DFlashDraftModel (transformers) serve the drafters we
# export, as we compute them? One command on the GPU machine (docs/drafter.md,
# "Serving: the reference DFlashDraftModel"):
#   1. builds with scripts/device/build.sh, running the drafter's and the
#      export's tests there (DFLASH_SKIP_BUILD=1: use build-gpu as it is);
#   2. trains two small drafters on the GPU in bf16 on the quickstart target
#      (300 steps each): A = the quickstart's (2 layers, blocks of 8, mask 259),
#      B = 3 layers, blocks of 16, the default mask token;
#   3. for each, in bf16 and in fp32: dflash-host eval on 16 held-out
#      prompts (--report), drafter_reference_dump (our logits, both code
#      paths), and scripts/check_reference_drafter.py (strict load, features,
#      logits, controls, the reference's own speculative decoding beside our
#      eval; AutoModel on the bf16 one); A's bf16 also with eager attention.
#
# Carry the Boost .debs and the reference code (both ignored by git):
#   scripts/fetch_device_deps.sh                                   # .deps/debs
#   scripts/fetch_reference_dflash.sh /path/to/z-lab-dflash.git    # .ref/dflash/model.py
#   run: scripts/device/reference_check.sh      carry: [".deps/debs", ".ref"]
#
#   scripts/device/reference_check.sh [OUTDIR]   (default $OUT, else /tmp/reference_check)
# For a dry run elsewhere: DFLASH_SKIP_BUILD=1 DFLASH_DEVICE_BUILD_DIR=build
# DFLASH_REFERENCE_DEVICE=cpu DFLASH_REFERENCE_STEPS=20 PYTHON=... (a Python
# with torch, transformers and safetensors).
# OUTDIR/summary.txt has the verdicts; OUTDIR/{A,B}/ the logs, eval_*.json,
# dump_*.safetensors, check_*.txt and check_*.json. Exit status 0 only when every
# check passed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/reference_check}}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

reference="$root/.ref/dflash/model.py"
if [ ! -f "$reference" ]; then
  say "missing $reference: run scripts/fetch_reference_dflash.sh GIT_DIR on the CPU machine and carry .ref"
  exit 2
fi
say "reference: $(tr '\n' ';' < "$root/.ref/dflash/SOURCE" 2>/dev/null)"

build="${DFLASH_DEVICE_BUILD_DIR:-$root/build-gpu}"
device=${DFLASH_REFERENCE_DEVICE:-cuda}
steps=${DFLASH_REFERENCE_STEPS:-300}
python=${PYTHON:-python3}
if [ "${DFLASH_SKIP_BUILD:-0}" != 1 ]; then
  say "== build and tests (scripts/device/build.sh -R 'DFlash|Export'): $out/build_and_tests.txt"
  if ! "$root/scripts/device/build.sh" -R 'DFlash|Export' > "$out/build_and_tests.txt" 2>&1; then
    grep -E "tests passed|FAILED|Failed|error:" "$out/build_and_tests.txt" | head -40 | tee -a "$summary"
    say "RESULT: FAIL (the build or the drafter's tests failed; see build_and_tests.txt)"
    exit 1
  fi
  grep -E "tests passed" "$out/build_and_tests.txt" | tee -a "$summary"
fi
host="$build/bin/dflash-host"
plugins="$build/lib/dflash-host/plugins"
dump="$build/bin/drafter_reference_dump"
for f in "$host" "$dump"; do
  [ -x "$f" ] || { say "missing $f: build first (scripts/device/build.sh)"; exit 2; }
done
"$python" -c 'import torch, transformers, safetensors; print("python", __import__("sys").version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tee -a "$summary"

# Nothing reaches the network there; the dynamic-module cache of AutoModel's
# trust_remote_code goes to a scratch folder.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=/tmp/reference_check_hf
config="$root/configs/quickstart.json"
target="$root/configs/quickstart/target"
prompts="$root/configs/quickstart/data/heldout.jsonl"
status=0

variant() {
  local name=$1; shift
  local dir="$out/$name" common=(--plugin-dir "$plugins" --config "$config" --set "train.device=\"$device\"" --set train.dtype=bfloat16 "$@")
  mkdir -p "$dir"
  say ""
  say "== variant $name: ${*:-the quickstart drafter}"
  rm -rf "$dir/run"
  if ! "$host" "${common[@]}" --set "train.steps=$steps" --set "train.checkpoint_every=$steps" --set train.eval_every=0 \
       --set "train.output_dir=\"$dir/run\"" > "$dir/train.log" 2>&1; then
    tail -20 "$dir/train.log" | tee -a "$summary"; say "$name: training failed"; status=1; return
  fi
  tail -3 "$dir/train.log" | tee -a "$summary"
  # As trained (bf16), and in fp32 (the weights upcast exactly, the target in
  # fp32 too): there the tolerance is tight enough to see an off-by-one that
  # bf16 rounding can hide, and speculative decoding must be exactly lossless.
  local precision
  for precision in bfloat16 float32; do
    if ! "$host" eval "${common[@]}" --set "train.dtype=\"$precision\"" --drafter-checkpoint "$dir/run" \
         --prompts "$prompts" --max-prompts 16 --report "$dir/eval_$precision.json" > "$dir/eval_$precision.txt" 2>&1; then
      tail -20 "$dir/eval_$precision.txt" | tee -a "$summary"; say "$name: our eval ($precision) failed"; status=1; return
    fi
    say "-- our eval, $precision:"
    grep -E "mean acceptance|lossless" "$dir/eval_$precision.txt" | tee -a "$summary"
    if ! "$dump" --plugin-dir "$plugins" --target "$target" --drafter "$dir/run" --device "$device" --prompts "$prompts" \
         --dtype "$precision" --out "$dir/dump_$precision.safetensors" > "$dir/dump_$precision.txt" 2>&1; then
      cat "$dir/dump_$precision.txt" | tee -a "$summary"; say "$name: drafter_reference_dump failed"; status=1; return
    fi
    grep -v "\[info\]" "$dir/dump_$precision.txt" | tee -a "$summary"
  done
  check "$dir" bf16_sdpa "$dir/dump_bfloat16.safetensors" sdpa --auto-model --generate-prompts "$prompts" \
    --generate-count 16 --our-eval "$dir/eval_bfloat16.json"
  [ -n "${EAGER:-}" ] && check "$dir" bf16_eager "$dir/dump_bfloat16.safetensors" eager
  check "$dir" fp32_sdpa "$dir/dump_float32.safetensors" sdpa --generate-prompts "$prompts" --generate-count 16 \
    --our-eval "$dir/eval_float32.json"
}

# check DIR LABEL DUMP ATTN [extra args]: one run of check_reference_drafter.py.
check() {
  local dir=$1 label=$2 file=$3 attn=$4; shift 4
  "$python" "$root/scripts/check_reference_drafter.py" --reference "$reference" --dump "$file" --target "$target" \
    --device "$device" --attn "$attn" "$@" --json "$dir/check_$label.json" > "$dir/check_$label.txt" 2>&1
  local rc=$?
  say "-- check_reference_drafter.py, $label (exit $rc): $dir/check_$label.txt"
  grep -E "^\[(PASS|FAIL|INFO)\]|^RESULT|^  +[0-9]+ +[0-9]+ |against an fp32 run" "$dir/check_$label.txt" |
    grep -v "^\[INFO\] environment" | tee -a "$summary"
  [ $rc -eq 0 ] || status=1
}

EAGER=eager variant A
variant B --set drafter.num_layers=3 --set drafter.block_size=16 --set drafter.mask_token_id=-1

say ""
if [ $status -eq 0 ]; then say "RESULT: PASS — every variant's checks passed"; else say "RESULT: FAIL — see above and $out"; fi
exit $status
