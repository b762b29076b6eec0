#!/usr/bin/env bash
# Our loss plugins and Liger-Kernel's fused linear cross-entropy side by side
# in one run on the GPU machine, at the DFlash shape (N 32,768, H 5120,
# V 248,320): bench/loss_bench (its floor GEMM, fused_ckpt_kl CE only and
# CE + KL), then scripts/liger_ce_step.py, each with its own same-run floor.
#   scripts/device/loss_vs_liger.sh [OUTDIR]   (carry .deps/debs and .liger)
# Liger is not part of this repository: put a copy of its package under
# .liger/ (ignored by git) and carry it:
#   mkdir -p .liger && git -C <Liger-Kernel clone> archive HEAD src/liger_kernel | tar -x -C .liger --strip-components=1
# SKIP_BUILD=1 reuses build-gpu/.
set -euo pipefail
# Four files at most (the GPU machine hands back 8 per call): build.txt,
# machine.txt (date, GPU), loss.txt (both benches' printed lines) and
# loss.jsonl (loss_bench's arms, then Liger's).
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/loss_vs_liger}}
mkdir -p "$out"
[ -d "$root/.liger/liger_kernel" ] || { echo "no .liger/liger_kernel: see this script's header" >&2; exit 2; }
[ "${SKIP_BUILD:-0}" = 1 ] || DFLASH_DEVICE_NO_TESTS=1 DFLASH_DEVICE_TARGETS="dflash-host loss_bench" "$root/scripts/device/build.sh" \
  > "$out/build.txt" 2>&1
{ date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv || true; } > "$out/machine.txt"
"$root/build-gpu/bin/loss_bench" --plugin-dir "$root/build-gpu/lib/dflash-host/plugins" --only fused_ckpt_kl \
  --json "$out/loss.jsonl" 2>&1 | grep -v "\[info\] loading" | tee "$out/loss.txt" || echo "loss_bench failed" | tee -a "$out/loss.txt"
python3 "$root/scripts/liger_ce_step.py" --liger "$root/.liger" --json "$out/loss.jsonl" 2>&1 | tee -a "$out/loss.txt" ||
  echo "liger failed" | tee -a "$out/loss.txt"
