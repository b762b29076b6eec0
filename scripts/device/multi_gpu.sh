#!/usr/bin/env bash
# Issue 19 on a GPU machine of several GPUs (nvidia-h200-x2 or -x4), one
# command: a build, then each part named in PARTS (default: all four), its
# files under OUTDIR and its summary on stdout.
#   tests     the distributed tests (tests/core/dist) with every rank on its own
#             GPU through NCCL (DFLASH_TEST_DIST_DEVICE=cuda): parameters
#             against one process, the kill-a-rank and hang behaviour, the
#             credit bound; the splits of four where four GPUs are.
#   scaling   bench/drafter_bench at the Qwen3.6-27B drafter shape (its
#             defaults, random inputs), the drafter alone: one process on one
#             GPU, then 2 (and 4) ranks under torchrun, with and without
#             --shard-optimizer; block tokens/s against N × one GPU's, each
#             rank's peaks.
#   pipeline  a Qwen3-8B-shaped random target (36 layers, H 4096) feeding the
#             8B drafter (5 layers): one GPU, colocated 2, disaggregated 1-1;
#             with 4 GPUs also colocated 4, 2-2, 3-1 and 1-3. Tokens/s, both
#             sides' stall fractions, each rank's peak, the advice line.
#   oom       (4 GPUs) the seed's 3 target + 1 drafter case, 65,536 tokens a
#             step (SEED_TOKENS=N for another budget, should that fit this
#             card): `plan` at this card's size, then `train` with
#             --skip-memory-check as configured and at the budget the plan
#             suggests, each rank's measured peak beside the plan's.
#   scripts/device/multi_gpu.sh OUTDIR      (carry .deps/debs)
# The GPU machine hands back 8 files a call: tar OUTDIR into $OUT, e.g.
#   scripts/device/multi_gpu.sh /tmp/mg; tar czf $OUT/mg.tgz -C /tmp mg
# SKIP_BUILD=1 reuses build-gpu/ (a machine still warm); PARTS="scaling" runs
# one part (a call lasts 10 minutes at most). Written 2026-12-04 on the CPU
# machine while no machine of several GPUs was lent: not yet run.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?OUTDIR}
work=${DFLASH_MULTI_GPU_WORK:-/tmp/dflash_multi_gpu}
mkdir -p "$out" "$work"
parts=" ${PARTS:-tests scaling pipeline oom} "
bin="$root/build-gpu/bin"
plugins="$root/build-gpu/lib/dflash-host/plugins"
host="$bin/dflash-host --no-default-plugin-dirs --plugin-dir $plugins"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
{ date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv; nvidia-smi topo -m; } \
  > "$out/machine.txt" 2>&1
echo "== $gpus GPUs; parts:$parts"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  DFLASH_DEVICE_SKIP_TESTS=1 "$root/scripts/device/build.sh" > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; exit 1; }
fi

# Each rank's peaks and the pipeline figures of a run's metrics.jsonl,
# steps 5 onwards (the first ones warm the allocator and the kernels).
summarise() {
  python3 - "$@" <<'PY'
import json, statistics, sys
name, path = sys.argv[1], sys.argv[2]
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    print(f"{name}: no metrics ({path})"); sys.exit(0)
rows = [r for r in rows if r.get("step", 0) >= 5] or rows
gib = lambda b: b / 2**30
line = f"{name}: {len(rows)} steps, median {statistics.median(r['tokens_per_s'] for r in rows):.0f} tokens/s, " \
       f"step {statistics.median(r['step_seconds'] for r in rows) * 1e3:.1f} ms"
p = [r["pipeline"] for r in rows if "pipeline" in r]
if p:
    line += f"; produced {statistics.median(x['produced_tokens_per_s'] for x in p):.0f} /s, consumed " \
            f"{statistics.median(x['consumed_tokens_per_s'] for x in p):.0f} /s; stalls: targets " \
            f"{statistics.median(x['target_stall_fraction'] for x in p):.2f}, drafters " \
            f"{statistics.median(x['drafter_stall_fraction'] for x in p):.2f}"
    last = p[-1]
    peaks = [f"target {t['rank']} {gib(t['memory_peak_bytes']):.2f}" for t in last["targets"]]
    peaks += [f"drafter {d['rank']} {gib(d['memory_peak_bytes']):.2f}" for d in last["drafters"]]
    line += "; peaks GiB: " + ", ".join(peaks)
    advice = [x for x in p if x.get("advice")]
    if advice:
        line += f"; bound {advice[-1].get('bound')}: {advice[-1]['advice']}"
elif "ranks" in rows[-1]:
    line += "; peaks GiB: " + ", ".join(f"{gib(r.get('memory_peak_bytes', 0)):.2f}" for r in rows[-1]["ranks"])
else:
    line += f"; peak {gib(rows[-1]['memory_peak_bytes']):.2f} GiB"
print(line)
PY
}

if [[ $parts == *" tests "* ]]; then
  echo "== tests: DFLASH_TEST_DIST_DEVICE=cuda dist_tests"
  DFLASH_TEST_DIST_DEVICE=cuda timeout 1200 "$bin/dist_tests" > "$out/dist_tests.txt" 2>&1
  echo "dist_tests exit status $?"
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|^\[ skipped  \]|^\[  PASSED  \]" "$out/dist_tests.txt"
fi

if [[ $parts == *" scaling "* ]]; then
  echo "== scaling: drafter_bench, 1 GPU then N ranks (torchrun)"
  bench="$bin/drafter_bench --plugin-dir $plugins --json $out/scaling.jsonl"
  # The ranks prove this run's secret to its rendezvous store (docs/distributed.md).
  export DFLASH_RUN_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  $bench > "$out/scaling_1.txt" 2>&1 || tail -5 "$out/scaling_1.txt"
  for n in 2 4; do
    [ "$gpus" -ge "$n" ] || continue
    for shard in "" --shard-optimizer; do
      torchrun --no-python --standalone --nproc-per-node "$n" $bench $shard > "$out/scaling_${n}${shard:+_sharded}.txt" 2>&1 ||
        tail -5 "$out/scaling_${n}${shard:+_sharded}.txt"
    done
  done
  python3 - "$out/scaling.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
one = next((r for r in rows if r.get("world_size", 1) == 1), None)
for r in rows:
    n = r.get("world_size", 1)
    rate = r.get("loss_rows_per_s", r.get("block_tokens_per_s"))
    ratio = rate / one.get("loss_rows_per_s", one.get("block_tokens_per_s")) if one else float("nan")
    ranks = "; ".join(f"rank {x['rank']} {x['step_ms']:.1f} ms, {x['step_peak_gib']:.2f} / {x['total_peak_gib']:.2f} GiB"
                      for x in r.get("ranks", []))
    print(f"{n} GPU(s){' sharded AdamW' if r.get('shard_optimizer') else ''}: {rate:.0f} block tokens/s = {ratio:.3f} x one GPU "
          f"({ratio / n:.3f} x N; target >= 0.92 x N); {ranks}")
PY
fi

if [[ $parts == *" pipeline "* ]]; then
  echo "== pipeline: Qwen3-8B-shaped target (36 layers) feeding the 8B drafter"
  config=$("$root/scripts/pipeline_8b_setup.sh" "$work" 2> "$out/make_q8.txt")
  steps="--set train.steps=30 --set train.log_every=10 --set train.checkpoint_every=0 --set train.progress=lines"
  run_pipeline() {  # NAME RANKS [host flags…]
    local name=$1 ranks=$2
    shift 2
    rm -rf "$work/run_$name"
    if [ "$ranks" = 1 ]; then
      $host --config "$config" $steps --set train.output_dir="$work/run_$name" "$@" > "$out/pipeline_$name.txt" 2>&1
    else
      "$bin/dflash-host" launch --nproc-per-node "$ranks" -- --no-default-plugin-dirs --plugin-dir "$plugins" \
        --config "$config" $steps --set train.output_dir="$work/run_$name" "$@" > "$out/pipeline_$name.txt" 2>&1
    fi
    echo "$name: exit status $?"
    cp "$work/run_$name/metrics.jsonl" "$out/pipeline_$name.jsonl" 2>/dev/null
    summarise "$name" "$work/run_$name/metrics.jsonl"
    grep -h "pipeline .*-bound" "$out/pipeline_$name.txt" | tail -1
  }
  run_pipeline one_gpu 1
  run_pipeline colocated_2 2
  run_pipeline split_1_1 2 --target-ranks 1 --drafter-ranks 1
  if [ "$gpus" -ge 4 ]; then
    run_pipeline colocated_4 4
    run_pipeline split_2_2 4 --target-ranks 2 --drafter-ranks 2
    run_pipeline split_3_1 4 --target-ranks 3 --drafter-ranks 1
    run_pipeline split_1_3 4 --target-ranks 1 --drafter-ranks 3
  fi
fi

if [[ $parts == *" oom "* ]]; then
  if [ "$gpus" -lt 4 ]; then
    echo "== oom: needs 4 GPUs, $gpus here"
  else
    echo "== oom: the seed's 3-1 case, ${SEED_TOKENS:-65536} tokens a step"
    # The seed's target: Qwen3.6-27B's shape, all 64 layers (random, ~54 GB on disk).
    [ -f "$work/q27_64/model.safetensors" ] ||
      python3 "$root/scripts/make_wide_target.py" "$work/q27_64" --preset qwen3.6-27b --layers 64 > "$out/make_q27.txt" 2>&1
    card_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    cat > "$work/seed.json" <<JSON
{
  "train": {"device": "cuda", "dtype": "bfloat16", "steps": 4, "grad_accumulation": 1, "queue_depth": 5,
            "checkpoint_every": 0, "progress": "lines"},
  "data": {"plugin": "synthetic", "vocab_size": 0, "row_length": 4096, "tokens_per_batch": ${SEED_TOKENS:-65536}},
  "target": {"plugin": "hf_decoder", "path": "$work/q27_64"},
  "drafter": {"plugin": "dflash", "num_layers": 5, "block_size": 16, "max_anchors": 128, "layer_ops": "aten"},
  "loss": {"plugin": "fused_ckpt_kl", "kl_weight": 0.0},
  "scheduler": {"plugin": "constant"}
}
JSON
    split="--target-ranks 3 --drafter-ranks 1"
    $host plan --config "$work/seed.json" $split --gpu-memory "${card_mib}MiB" > "$out/oom_plan.txt" 2>&1
    echo "plan at ${card_mib} MiB: exit status $? (6: does not fit)"
    grep -E "predicted peak|verdict|--set " "$out/oom_plan.txt"
    oom_run() {  # NAME [host flags…]
      local name=$1
      shift
      rm -rf "$work/run_$name"
      "$bin/dflash-host" launch --nproc-per-node 4 -- --no-default-plugin-dirs --plugin-dir "$plugins" \
        --config "$work/seed.json" $split --set train.output_dir="$work/run_$name" "$@" > "$out/oom_$name.txt" 2>&1
      echo "$name: exit status $?"
      grep -iE "out of memory|short by|rank [0-9]+.*(failed|stopped)" "$out/oom_$name.txt" | head -8
      cp "$work/run_$name/metrics.jsonl" "$out/oom_$name.jsonl" 2>/dev/null
      summarise "$name" "$work/run_$name/metrics.jsonl"
    }
    oom_run as_configured --skip-memory-check
    suggested=$(grep -oE "set data.tokens_per_batch=[0-9]+" "$out/oom_plan.txt" | head -1 | cut -d= -f2)
    if [ -n "$suggested" ]; then
      $host plan --config "$work/seed.json" $split --gpu-memory "${card_mib}MiB" --set data.tokens_per_batch="$suggested" --json \
        > "$out/oom_plan_suggested.json" 2> /dev/null
      oom_run suggested --set data.tokens_per_batch="$suggested"
      python3 - "$out/oom_plan_suggested.json" "$work/run_suggested/metrics.jsonl" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2])]
last = rows[-1]["pipeline"]
measured = {"target": max(t["memory_peak_bytes"] for t in last["targets"]),
            "drafter": max(d["memory_peak_bytes"] for d in last["drafters"])}
for name, role in plan["roles"].items():  # "target rank", "drafter rank"
    kind = "target" if "target" in name else "drafter"
    predicted, got = role["peak_bytes"], measured[kind]
    print(f"{name}: predicted {predicted / 2**30:.2f} GiB, measured {got / 2**30:.2f} GiB, "
          f"error {100 * (predicted - got) / got:+.1f} % (target within 10 %)")
PY
    else
      echo "the plan suggested no token budget (it fits as configured?)"
    fi
  fi
fi
