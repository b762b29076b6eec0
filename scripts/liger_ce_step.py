#!/usr/bin/env python3
"""Liger-Kernel's fused linear cross-entropy, timed the way bench/loss_bench
times our losses, in the same run on the GPU machine
(scripts/device/loss_vs_liger.sh): issue 20's CE-only comparison.

Liger (github.com/linkedin/Liger-Kernel) is not part of this repository: the
script imports it from the folder given with --liger (a copy of its `src`
brought to the GPU machine for the run).

The shape and inputs are loss_bench's: hidden [N, H] bf16 requiring grad, a
frozen lm_head [V, H] bf16 scaled by 1/sqrt(H), random targets with 10 % of
rows ignored (-100), mean reduction. (Our arm also weighs rows; Liger's CE
has no per-row weights: one multiply per row, nothing at this scale.) Time:
forward and backward (Liger computes the gradient in its forward), median
of the repeats after the warm-ups, synchronised. Extra peak: the
allocator's peak during a call minus what was allocated before it. The
floor is one plain GEMM [N, H] x [H, V] in this run, as loss_bench's.

    python3 scripts/liger_ce_step.py --liger DIR [--rows 32768 --hidden 5120 --vocab 248320] [--json out.jsonl]
"""
import argparse
import json
import statistics
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--liger", required=True, help="a folder holding the liger_kernel package")
    p.add_argument("--rows", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--vocab", type=int, default=248320)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    sys.path.insert(0, a.liger)
    import torch
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    torch.manual_seed(0)
    dev = torch.device("cuda")
    n, h, v = a.rows, a.hidden, a.vocab
    weight = (torch.randn(v, h, device=dev, dtype=torch.bfloat16) / h ** 0.5).contiguous()
    hidden = torch.randn(n, h, device=dev, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, v, (n,), device=dev)
    targets.masked_fill_(torch.rand(n, device=dev) < 0.1, -100)

    def measure(fn):
        times, peaks = [], []
        for i in range(a.warmup + a.repeats):
            hidden.grad = None
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if i >= a.warmup:
                times.append((time.perf_counter() - start) * 1e3)
                peaks.append((torch.cuda.max_memory_allocated() - before) / 2 ** 30)
        return statistics.median(times), max(peaks)

    def gemm():
        with torch.no_grad():
            torch.matmul(hidden, weight.t())

    def liger():
        out = LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, targets, None, None, -100, 0.0, 0.0, "mean")
        # Newer Liger returns (loss, z_loss, token_accuracy, ...); older, the loss alone.
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward()

    gemm_ms, gemm_peak = measure(gemm)
    liger_ms, liger_peak = measure(liger)
    flop = 2.0 * n * h * v
    print(f"liger_ce_step: N={n} H={h} V={v} bf16, frozen lm_head; median of {a.repeats} after {a.warmup}")
    print(f"GEMM [N,H]x[H,V] (floor) {gemm_ms:.1f} ms ({flop / gemm_ms / 1e9:.0f} TFLOP/s), extra peak {gemm_peak:.2f} GiB")
    print(f"Liger fused linear CE {liger_ms:.1f} ms = {liger_ms / (2 * gemm_ms):.3f} x 2 GEMMs, extra peak {liger_peak:.2f} GiB")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"arm": "liger_fused_linear_ce", "ms": liger_ms, "extra_peak_gib": liger_peak,
                                "gemm_ms": gemm_ms, "ratio_2_gemms": liger_ms / (2 * gemm_ms),
                                "rows": n, "hidden": h, "vocab": v}) + "\n")


if __name__ == "__main__":
    main()
