#!/usr/bin/env bash
# The distributed engine on the GPU machine (one GPU), one command: builds,
# runs the dist and settings tests (NCCL at world size one), then times the
# trainer at the drafter bench shape (docs/performance.md: Qwen3.6-27B
# drafter, 5 layers, H 5120, V 248,320, 4096 context, 512 anchors × 16)
# run plainly and as one rank of `dflash-host launch` (ProcessGroupNCCL),
# alternating, to docs/distributed.md's table.
#   scripts/device/dist_check.sh [OUTDIR]       (carry .deps/debs)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/dist_check}}
mkdir -p "$out"
DFLASH_DEVICE_SKIP_TESTS=1 "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
grep -E "dflash-host: (NCCL|no)|Gloo" "$out/build.txt" || true
bin="$root/build-gpu/bin"
"$bin/dist_tests" > "$out/dist_tests.txt" 2>&1 || true
"$bin/run_settings_tests" > "$out/run_settings_tests.txt" 2>&1 || true
for f in dist_tests run_settings_tests; do grep -v "info\]" "$out/$f.txt" | tail -n 12; done

# A target of the 27B drafter's width and vocabulary (8 random layers).
target=/tmp/dist_target
python3 "$root/bench/make_random_qwen3.py" "$target" --layers 8 --hidden 5120 --heads 32 --kv-heads 8 --head-dim 128 \
  --intermediate 17408 --vocab 248320 > "$out/make_target.txt" 2>&1
steps=${DFLASH_DIST_STEPS:-40}
cat > /tmp/dist_bench.json <<JSON
{
  "train": {"seed": 0, "device": "cuda", "dtype": "bfloat16", "steps": $steps, "lr": 1e-4, "teacher": "none",
            "progress": "lines", "log_every": 10, "checkpoint_every": 0, "prefetch": true},
  "data": {"plugin": "synthetic", "sequences": 100000, "min_length": 4096, "max_length": 4096, "row_length": 4096,
           "tokens_per_batch": 4096, "prompt_fraction": 0.0, "structure": "uniform"},
  "target": {"plugin": "hf_decoder", "path": "$target"},
  "drafter": {"plugin": "dflash", "num_layers": 5, "block_size": 16, "max_anchors": 512},
  "loss": {"plugin": "fused_ckpt_kl", "kl_weight": 0.0},
  "scheduler": {"plugin": "constant"}
}
JSON
host="$bin/dflash-host --no-default-plugin-dirs --plugin-dir $root/build-gpu/lib/dflash-host/plugins"
for round in 1 2; do
  rm -rf /tmp/dist_plain /tmp/dist_nccl
  $host --config /tmp/dist_bench.json --set train.output_dir='"/tmp/dist_plain"' --stop-after "$steps" \
    > "$out/plain_$round.txt" 2>&1 || tail -20 "$out/plain_$round.txt"
  cp /tmp/dist_plain/metrics.jsonl "$out/plain_$round.jsonl" || true
  $bin/dflash-host launch --nproc-per-node 1 -- --no-default-plugin-dirs --plugin-dir "$root/build-gpu/lib/dflash-host/plugins" \
    --config /tmp/dist_bench.json --set train.output_dir='"/tmp/dist_nccl"' --stop-after "$steps" \
    > "$out/nccl_$round.txt" 2>&1 || tail -20 "$out/nccl_$round.txt"
  cp /tmp/dist_nccl/metrics.jsonl "$out/nccl_$round.jsonl" || true
done
grep -h "joined\|NCCL" "$out"/nccl_1.txt | head -3 || true
python3 - "$out" <<'PY'
import json, statistics, sys, glob, os
out = sys.argv[1]
def steps(path):
    rows = [json.loads(l) for l in open(path)]
    return [r["step_seconds"] for r in rows if r["step"] >= 10]
for kind in ("plain", "nccl"):
    for f in sorted(glob.glob(os.path.join(out, kind + "_*.jsonl"))):
        s = steps(f)
        print(f"{os.path.basename(f)}: {len(s)} steps, median {statistics.median(s)*1000:.1f} ms, mean {statistics.mean(s)*1000:.1f} ms")
plain = [x for f in glob.glob(os.path.join(out, "plain_*.jsonl")) for x in steps(f)]
nccl = [x for f in glob.glob(os.path.join(out, "nccl_*.jsonl")) for x in steps(f)]
print(f"median step: plain {statistics.median(plain)*1000:.1f} ms, one NCCL rank {statistics.median(nccl)*1000:.1f} ms, "
      f"ratio {statistics.median(nccl)/statistics.median(plain):.4f}")
PY
