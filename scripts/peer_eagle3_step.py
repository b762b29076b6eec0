#!/usr/bin/env python3
"""The peer's EAGLE-3 training step, timed the way bench/eagle3_bench times
ours, in the same run on the GPU machine (scripts/device/peer_eagle3.sh;
issue 43, docs/eagle3.md "The step against SpecForge").

The peer is SpecForge's EAGLE-3 trainer (github.com/sgl-project/SpecForge):
its LlamaForCausalLMEagle3 inside OnlineEagle3Model, TTT over ttt_length
steps (default 7) with per-step weights 0.8^i (Eagle3TrainStrategy), its
BF16Optimizer (AdamW over fp32 master copies, grad clipping at 0.5), its
default attention backend (flex_attention). The teacher, as its trainer makes
it from a target's final hidden states:
  --teacher logits   (the default) the frozen target head gives full
                     [S, V] logits inside the step (TargetHead), which
                     OnlineEagle3Model restricts to the draft vocabulary;
  --teacher compact  training.compact_teacher: the head streamed in
                     vocabulary chunks, no [S, V] tensor.
Its code is not part of this repository: the script loads the modules it
needs from --specforge (scripts/fetch_reference_eagle3.sh copies them to
.ref/eagle3), without running the package's __init__ files.

Shape: one Llama decoder layer of the target's width (Llama-3.1-8B: H 4096,
32/8 heads x 128, MLP 14336, V 128,256; Qwen3-8B: MLP 12288, V 151,936), a
32,000-token draft vocabulary (SpecForge's configs), bf16 weights, the frozen
embedding and target head on the device. Inputs are random, one row of
--context tokens drawn from the draft vocabulary. Memory: the allocator's
peak during the timed steps minus what was allocated before them (the step
peak), and the peak itself (the total), as eagle3_bench reports them.

    python3 scripts/peer_eagle3_step.py --specforge .ref/eagle3 --shape llama3-8b --context 2048 [--json out.jsonl]
"""
import argparse
import importlib
import json
import os
import statistics
import sys
import time
import types

SHAPES = {
    # SpecForge's configs/llama3-8B-eagle3.json and configs/qwen3-8b-eagle3.json
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, vocab_size=128256, draft_vocab_size=32000, rms_norm_eps=1e-5, rope_theta=500000.0),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, vocab_size=151936, draft_vocab_size=32000, rms_norm_eps=1e-6, rope_theta=1000000.0),
}


def load_specforge(root):
    """The modules the EAGLE-3 step needs, from the copy under root; the
    packages above them as bare namespaces (their __init__ files import every
    model and backend SpecForge has)."""
    base = os.path.join(root, "specforge")
    for name in ("specforge", "specforge.modeling", "specforge.modeling.draft", "specforge.core",
                 "specforge.algorithms", "specforge.algorithms.eagle3"):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(base, *name.split(".")[1:])]
        sys.modules[name] = module
    draft = sys.modules["specforge.modeling.draft"]
    draft.Eagle3DraftModel = importlib.import_module("specforge.modeling.draft.base").Eagle3DraftModel
    eagle = importlib.import_module("specforge.modeling.draft.llama3_eagle")
    model = importlib.import_module("specforge.algorithms.eagle3.model")
    optimizer = importlib.import_module("specforge.optimizer")
    return eagle.LlamaForCausalLMEagle3, model.OnlineEagle3Model, optimizer.BF16Optimizer


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--specforge", required=True, help="a folder holding SpecForge's specforge/ modules")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument("--teacher", choices=["logits", "compact"], default="logits")
    p.add_argument("--attention", default="flex_attention", help="SpecForge's training.attention_backend")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()

    import torch
    from transformers import LlamaConfig
    Eagle3, OnlineEagle3Model, BF16Optimizer = load_specforge(a.specforge)

    torch.manual_seed(0)
    dev = torch.device("cuda")
    shape = SHAPES[a.shape]
    H, V, Vd, S = shape["hidden_size"], shape["vocab_size"], shape["draft_vocab_size"], a.context
    config = LlamaConfig(num_hidden_layers=1, max_position_embeddings=max(4096, S + a.ttt), hidden_act="silu",
                         tie_word_embeddings=False, pad_token_id=0, **shape)
    draft = Eagle3(config, attention_backend=a.attention).to(dev, torch.bfloat16)
    draft.freeze_embedding()
    with torch.no_grad():  # the draft vocabulary: the first Vd target ids
        draft.t2d.zero_()
        draft.t2d[:Vd] = True
        draft.d2t.zero_()
    model = OnlineEagle3Model(draft, length=a.ttt, attention_backend=a.attention)
    head = (torch.randn(V, H, device=dev, dtype=torch.bfloat16) / H ** 0.5).requires_grad_(False)
    optimizer = BF16Optimizer(draft, lr=1e-4, max_grad_norm=0.5, total_steps=1000)
    trainable = sum(q.numel() for q in draft.parameters() if q.requires_grad)

    input_ids = torch.randint(0, Vd, (1, S), device=dev)
    attention_mask = torch.ones(1, S, dtype=torch.long, device=dev)
    loss_mask = torch.ones(1, S, 1, dtype=torch.long, device=dev)
    features = torch.randn(1, S, 3 * H, device=dev, dtype=torch.bfloat16)
    last_hidden = torch.randn(1, S, H, device=dev, dtype=torch.bfloat16)

    def step():
        if a.teacher == "logits":
            # TargetHead: the frozen head over the target's final hidden states.
            target = torch.nn.functional.linear(last_hidden, head)
            extra = {}
        else:
            target = None
            extra = {"target_hidden_for_compact": last_hidden, "target_head_weight": head}
        plosses = model(input_ids=input_ids, attention_mask=attention_mask, target=target, loss_mask=loss_mask,
                        hidden_states=features, **extra)[0]
        loss = sum(0.8 ** i * l for i, l in enumerate(plosses))
        loss.backward()
        optimizer.step()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    peak = torch.cuda.max_memory_allocated(dev)
    step_ms = statistics.median(times)
    gib = float(1 << 30)
    who = f"SpecForge EAGLE-3 ({a.attention}, teacher {a.teacher}, BF16Optimizer fp32 master)"
    print(f"peer eagle3 {a.shape}: {trainable / 1e9:.3f} B trainable; context {S}, ttt {a.ttt}; step {step_ms:.1f} ms, "
          f"{S / (step_ms / 1000):.0f} tokens/s; step peak {(peak - before) / gib:.2f} GiB (above the {before / gib:.2f} "
          f"GiB allocated before the step); total peak {peak / gib:.2f} GiB; {who}; {torch.cuda.get_device_name(dev)}",
          flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"who": who, "shape": a.shape, "context": S, "ttt": a.ttt, "teacher": a.teacher,
                                "step_ms": step_ms, "times_ms": times, "step_peak_gib": (peak - before) / gib,
                                "total_peak_gib": peak / gib, "trainable": trainable, "torch": torch.__version__,
                                "device": torch.cuda.get_device_name(dev)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
