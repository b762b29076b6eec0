#!/usr/bin/env bash
# torchrun --no-python starting dflash-host on the GPU machine (which has
# torch's torchrun): a rank killed mid-run, torchrun --max-restarts relaunches
# the group on its agent store, and the run resumes from its checkpoint.
#   scripts/device/torchrun_check.sh [OUTDIR]       (carry .deps/debs)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/torchrun_check}}
mkdir -p "$out"
DFLASH_DEVICE_NO_TESTS=1 "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
cat > /tmp/tr.json <<JSON
{"train": {"seed": 3, "device": "cuda", "steps": 300, "lr": 3e-3, "output_dir": "/tmp/tr_run", "progress": "lines",
           "log_every": 50, "checkpoint_every": 5, "grad_accumulation": 2},
 "data": {"plugin": "synthetic", "sequences": 64, "min_length": 24, "max_length": 64, "row_length": 64, "tokens_per_batch": 128},
 "target": {"plugin": "hf_decoder", "path": "$root/tests/fixtures/hf_tiny/qwen3"},
 "drafter": {"plugin": "dflash", "num_layers": 1, "block_size": 4, "max_anchors": 8},
 "loss": {"plugin": "fused_ckpt_kl", "kl_weight": 0.5}, "scheduler": {"plugin": "constant"}}
JSON
rm -rf /tmp/tr_run
# The ranks prove this run's secret to its rendezvous store (docs/distributed.md).
export DFLASH_RUN_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
torchrun --no-python --nnodes 1 --nproc-per-node 1 --max-restarts 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29555 \
  "$root/build-gpu/bin/dflash-host" --no-default-plugin-dirs --plugin-dir "$root/build-gpu/lib/dflash-host/plugins" \
  --config /tmp/tr.json > "$out/torchrun.txt" 2>&1 &
tr=$!
for i in $(seq 1 600); do [ -d /tmp/tr_run/checkpoints/step-00000010 ] && break; sleep 0.1; done
worker=$(pgrep -f "^$root/build-gpu/bin/dflash-host" | head -1)
echo "killing worker $worker at $(ls /tmp/tr_run/checkpoints | tr '\n' ' ')"
kill -9 "$worker"
wait $tr; echo "torchrun exit $?"
grep -E "rank 0/1|resumed from|joined|restart|Restart|error" "$out/torchrun.txt" | grep -v loading | head -20
tail -n 1 /tmp/tr_run/metrics.jsonl | cut -c1-200
