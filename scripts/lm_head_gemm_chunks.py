#!/usr/bin/env python3
"""The lm_head GEMMs of a chunked loss at the DFlash shape (N 32,768,
H 5120, V 248,320, bf16) by chunk size, on the GPU machine: the logits GEMM
(z = h·Wᵀ), the input-gradient GEMM (dh = g·W) and both in turn, over all N
rows in chunks of 512 to 4096 rows, twice, each beside the one-GEMM floor;
then Liger-Kernel's fused linear cross-entropy timed and profiled (its
GEMMs and its kernel, per kernel name).

    python3 scripts/lm_head_gemm_chunks.py LIGER_DIR   (a folder holding liger_kernel)

Figures of 2026-12-04 are in docs/performance.md ("Issue 20's loss targets").
"""
import sys, statistics, torch
sys.path.insert(0, sys.argv[1])
dev = "cuda"; V = 248320; H = 5120; N = 32768
torch.manual_seed(0)
W = (torch.randn(V, H, device=dev, dtype=torch.bfloat16) / H ** 0.5)
X = torch.randn(N, H, device=dev, dtype=torch.bfloat16)
dX = torch.empty_like(X)
def ev_time(fn, reps=5, warm=2):
    ts = []
    for i in range(warm + reps):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(); s.record(); fn(); e.record(); torch.cuda.synchronize()
        if i >= warm: ts.append(s.elapsed_time(e))
    return statistics.median(ts)
bufs = {r: torch.empty(r, V, device=dev, dtype=torch.bfloat16) for r in (512, 1024, 2048, 4096)}
for rnd in range(2):
    print("floor", round(ev_time(lambda: torch.matmul(X, W.t())), 1))
    for r, L in bufs.items():
        def g1():
            for s in range(0, N, r): torch.matmul(X[s:s+r], W.t(), out=L)
        def g2():
            for s in range(0, N, r): torch.mm(L, W, out=dX[s:s+r])
        def both():
            for s in range(0, N, r):
                torch.matmul(X[s:s+r], W.t(), out=L); torch.mm(L, W, out=dX[s:s+r])
        print(f"rows {r}: GEMM1 {ev_time(g1):.1f} ms  GEMM2 {ev_time(g2):.1f} ms  both {ev_time(both):.1f} ms")
# Liger in flow, profiled
from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
Xg = X.clone().requires_grad_(True)
y = torch.randint(0, V, (N,), device=dev); y.masked_fill_(torch.rand(N, device=dev) < 0.1, -100)
def liger():
    Xg.grad = None
    out = LigerFusedLinearCrossEntropyFunction.apply(Xg, W, y, None, None, -100, 0.0, 0.0, "mean")
    (out[0] if isinstance(out, tuple) else out).backward()
print("liger", round(ev_time(liger), 1))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as p:
    liger(); torch.cuda.synchronize()
tot = {}
for e in p.events():
    if e.device_type.name == "CUDA":
        k = e.name[:60]; t, c = tot.get(k, (0.0, 0)); tot[k] = (t + e.device_time / 1e3, c + 1)
for k, (t, c) in sorted(tot.items(), key=lambda kv: -kv[1][0])[:12]:
    print(f"  {t:8.2f} ms {c:4d} x {k}")
