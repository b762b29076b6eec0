#!/usr/bin/env bash
# Our drafter step and the peer's, side by side in one run on the GPU
# machine, at the peer's three published shapes (issue 20): bench/drafter_bench
# and scripts/peer_drafter_step.py, each shape the peer then ours (whose ratios
# are to the peer's line of the same call: drafter_bench --peer).
#   scripts/device/peer_drafter.sh [OUTDIR]   (carry .deps/debs and .peer)
# The peer's code is not part of this repository: put a copy of SpecForge's
# `specforge` package under .peer/ (ignored by git) and carry it:
#   mkdir -p .peer && git -C <SpecForge clone> archive HEAD specforge | tar -x -C .peer
# OURS_VARIANTS="--embedding-on-cpu;--layer-ops aten" runs ours once more per
# ';'-separated flag set at each shape (the default configuration always runs).
# SHAPES="4096 512 16;8192 1024 16" runs only those shapes (default all three);
# NO_PEER=1 runs only ours. The peer's Python warnings (flex attention's) are
# left out of steps.txt: their "UserWarning" line and the source line below it.
set -euo pipefail
# Four files at most (the GPU machine hands back 8 per call): build.txt,
# machine.txt (date, GPU), steps.txt (both sides' printed lines, shape by
# shape) and steps.jsonl (ours: drafter_bench's record; the peer's has "who").
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/peer_drafter}}
mkdir -p "$out"
[ -d "$root/.peer/specforge" ] || { echo "no .peer/specforge: see this script's header" >&2; exit 2; }
[ "${SKIP_BUILD:-0}" = 1 ] || DFLASH_DEVICE_NO_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host drafter_bench" "$root/scripts/device/build.sh" \
  > "$out/build.txt" 2>&1
{ date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv || true; } > "$out/machine.txt"
IFS=';' read -ra shapes <<< "${SHAPES:-4096 512 16;8192 1024 16;3072 1024 32}"
for shape in "${shapes[@]}"; do
  set -- $shape
  # The peer first: ours then prints its ratios against the peer's line of
  # this call (drafter_bench --peer), never against remembered figures.
  peer=()
  if [ "${NO_PEER:-0}" != 1 ]; then
    echo "== peer $shape" >> "$out/steps.txt"
    if python3 "$root/scripts/peer_drafter_step.py" --specforge "$root/.peer" --context "$1" --anchors "$2" --block "$3" \
      --json "$out/peer.jsonl" 2>&1 | grep -v -E "UserWarning|^ +(warnings\.warn|_warn_once)\(" >> "$out/steps.txt"; then
      peer=(--peer "$out/peer.jsonl")
    else
      echo "peer $shape failed" >> "$out/steps.txt"
    fi
  fi
  IFS=';' read -ra variants <<< "${OURS_VARIANTS:-}"
  for flags in "" "${variants[@]}"; do
    echo "== ours $shape ${flags}" >> "$out/steps.txt"
    # shellcheck disable=SC2086
    "$root/build-gpu/bin/drafter_bench" --plugin-dir "$root/build-gpu/lib/dflash-host/plugins" --context "$1" --anchors "$2" \
      --block "$3" $flags "${peer[@]}" --json "$out/steps.jsonl" 2>&1 | grep -v "\[info\] loading" >> "$out/steps.txt" ||
      echo "ours $shape $flags failed" >> "$out/steps.txt"
  done
done
cat "$out/peer.jsonl" >> "$out/steps.jsonl" 2>/dev/null || true
grep -E "^==|^step|^useful|step_ms|failed" "$out/steps.txt"
