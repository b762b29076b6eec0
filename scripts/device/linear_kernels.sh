#!/usr/bin/env bash
# The invariant linear's kernels alone on the GPU machine (issue 41), in under
# two minutes and without the project's build: the tiling sweep of the
# mma.sync kernel (bench/invariant_linear/tiling_sweep.cu) and the probe of
# a warpgroup-MMA (wgmma) kernel beside it (wgmma_probe.cu; sm_90a only).
#   scripts/device.sh linear_kernels OUTDIR     (nothing to carry)
# LINEAR_KERNELS=probe runs the probe alone, =sweep the sweep alone.
# OUTDIR gets tiling_sweep.txt and wgmma_probe.txt.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: scripts/device.sh linear_kernels OUTDIR}
mkdir -p "$out"
which=${LINEAR_KERNELS:-both}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/machine.txt" 2>&1 || true
cd "$root"
include=-Iplugins/shared/cuda_kernels
if [ "$which" != sweep ]; then
  nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -O3 $include bench/invariant_linear/wgmma_probe.cu \
    -o /tmp/wgmma_probe && timeout 120 /tmp/wgmma_probe > "$out/wgmma_probe.txt" 2>&1
  echo "wgmma probe exit $?"; cat "$out/wgmma_probe.txt"
fi
if [ "$which" != probe ]; then
  nvcc -std=c++17 -arch=sm_90 -O3 $include bench/invariant_linear/tiling_sweep.cu -o /tmp/tiling_sweep &&
    /tmp/tiling_sweep > "$out/tiling_sweep.txt" 2>&1
  echo "tiling sweep exit $?"; tail -5 "$out/tiling_sweep.txt"
fi
