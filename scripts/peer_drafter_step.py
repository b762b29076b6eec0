#!/usr/bin/env python3
"""The peer's DFlash drafter training step, timed the way bench/drafter_bench
times ours, in the same run on the GPU machine (scripts/device/peer_drafter.sh).

The peer is SpecForge's DFlash trainer (github.com/sgl-project/SpecForge): its
DFlashDraftModel inside OnlineDFlashModel, flex attention, bf16 weights,
gradients and AdamW states (torch's fused AdamW), grad clipping at 1.0. Its
code is not part of this repository: the script imports it from the folder
given with --specforge (a copy brought to the GPU machine for the run).

Shape: the Qwen3.6-27B drafter (5 layers, H 5120, 32/8 heads x 128, MLP
17408, V 248,320, every layer full attention, as ours), with the frozen
embedding and lm_head on the device. Inputs are random, one row, every
position supervised. Memory: the allocator's peak during the timed steps
minus what was allocated before them (the step peak), and the peak itself
(the total), as drafter_bench reports them.

    python3 scripts/peer_drafter_step.py --specforge DIR --context 4096 --anchors 512 --block 16 [--json out.jsonl]
"""
import argparse
import json
import statistics
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--specforge", required=True, help="a folder holding the specforge package")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--anchors", type=int, default=512)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    sys.path.insert(0, a.specforge)
    import torch
    from transformers import Qwen3Config
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel

    torch.manual_seed(0)
    dev = torch.device("cuda")
    H, V, layers = 5120, 248320, 5
    config = Qwen3Config(hidden_size=H, intermediate_size=17408, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, vocab_size=V, num_hidden_layers=layers, max_position_embeddings=262144,
                         rms_norm_eps=1e-6, rope_theta=10000000, tie_word_embeddings=False,
                         layer_types=["full_attention"] * layers, use_sliding_window=False, sliding_window=None)
    config.num_target_layers = 64
    config.block_size = a.block
    config.dflash_config = {"mask_token_id": V - 250, "target_layer_ids": [1, 16, 31, 46, 61]}
    config._attn_implementation = "flex_attention"
    draft = DFlashDraftModel(config).to(dev, torch.bfloat16)
    embed = torch.nn.Embedding(V, H).to(dev, torch.bfloat16).requires_grad_(False)
    head = torch.nn.Linear(H, V, bias=False).to(dev, torch.bfloat16).requires_grad_(False)
    model = OnlineDFlashModel(draft, head, embed, mask_token_id=V - 250, block_size=a.block,
                              attention_backend="flex_attention", num_anchors=a.anchors)
    params = [q for q in draft.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    input_ids = torch.randint(0, V - 256, (1, a.context), device=dev)
    hidden = torch.randn(1, a.context, 5 * H, device=dev, dtype=torch.bfloat16)
    loss_mask = torch.ones(1, a.context, device=dev, dtype=torch.long)

    def step():
        loss, _, _ = model(input_ids=input_ids, hidden_states=hidden, loss_mask=loss_mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    peak = torch.cuda.max_memory_allocated()
    ms = statistics.median(times)
    gib = float(1 << 30)
    out = {"who": "peer (SpecForge DFlash, flex attention)", "context": a.context, "anchors": a.anchors, "block": a.block,
           "step_ms": ms, "block_tokens_per_s": a.anchors * a.block / (ms / 1000), "step_peak_gib": (peak - before) / gib,
           "allocated_before_gib": before / gib, "total_peak_gib": peak / gib,
           "parameters": sum(q.numel() for q in params), "torch": torch.__version__}
    print(json.dumps(out))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
