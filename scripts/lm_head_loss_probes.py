#!/usr/bin/env python3
"""Probes of issue 20's loss question at the DFlash lm_head shape (H 5120,
V 248,320, bf16) on the GPU machine, beside Liger-Kernel:

  overlap  For chunks of 1024 and 2048 rows: Liger's cross-entropy kernel
           alone on a chunk of logits (its two passes in one launch); a pure
           read (amax) and a read + write (mul_) of the chunk as bandwidth
           references; the chunk's logits GEMM alone; and the GEMM on the
           default stream beside Liger's kernel (or the read) on a
           high-priority side stream, launched in either order, against the
           two run one after the other ("the softmax passes overlapped with
           the next chunk's GEMM").
  gemms    The lm_head GEMMs of a chunked loss over N 32,768 rows by chunk
           size: the logits GEMM (z = h·Wᵀ), the input-gradient GEMM
           (dh = g·W) and both in turn, in chunks of 512 to 4096 rows, twice,
           each beside the one-GEMM floor; then Liger's fused linear
           cross-entropy timed and profiled (its GEMMs and its kernel).

    python3 scripts/lm_head_loss_probes.py overlap|gemms LIGER_DIR   (a folder holding liger_kernel)

Figures of 2026-12-04 are in docs/performance.md ("Issue 20's loss targets").
"""
import statistics
import sys

import torch

dev = "cuda"; V = 248320; H = 5120


def ev_time(fn, reps, warm):
    """Median CUDA-event time of fn in ms, after `warm` unrecorded calls."""
    ts = []
    for i in range(warm + reps):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(); s.record(); fn(); e.record(); torch.cuda.synchronize()
        if i >= warm: ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def overlap(W):
    from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel
    ev = lambda fn: ev_time(fn, reps=10, warm=3)
    for rows in (1024, 2048):
        x = torch.randn(rows, H, device=dev, dtype=torch.bfloat16)
        L = torch.empty(rows, V, device=dev, dtype=torch.bfloat16)
        L2 = torch.empty(rows, V, device=dev, dtype=torch.bfloat16)
        torch.matmul(x, W.t(), out=L); L2.copy_(L)
        y = torch.randint(0, V, (rows,), device=dev); y.masked_fill_(torch.rand(rows, device=dev) < 0.1, -100)
        loss = torch.empty(rows, device=dev, dtype=torch.float32)
        def liger(buf=L):
            liger_cross_entropy_kernel[(rows,)](X_ptr=buf, X_stride=buf.stride(-2), Y_ptr=y, Y_stride=1, weight_ptr=None,
                loss_ptr=loss, z_loss_ptr=None, loss_stride=1, token_accuracy_ptr=None, token_accuracy_stride=0,
                predicted_tokens_ptr=None, predicted_tokens_stride=0, n_cols=V, n_non_ignore=rows, sum_non_ignore_weight=rows,
                weight_sum=0.0, ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0, reduction="mean", softcap=None,
                RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=False, RETURN_PREDICTED_TOKENS=False, HAS_WEIGHT=False,
                HAS_SOFTCAPPING=False, HAS_GRADIENTS=True, BLOCK_SIZE=32768, num_warps=32)
        gb = rows * V * 2 / 1e9
        t_l = ev(lambda: (L.copy_(L2), liger()))  # copy restores logits (liger overwrites)
        t_c = ev(lambda: L.copy_(L2))
        t_r = ev(lambda: torch.amax(L2, dim=1))
        t_rw = ev(lambda: L2.mul_(1.0))
        t_g = ev(lambda: torch.matmul(x, W.t(), out=L))
        print(f"rows {rows}: logits {gb:.3f} GB; liger kernel {t_l - t_c:.3f} ms (=> {2.7*gb/(t_l-t_c)*1e3/1e3:.2f} TB/s if 2.7 passes); "
              f"amax read {t_r:.3f} ms ({gb/t_r:.2f} TB/s); mul_ rw {t_rw:.3f} ms ({2*gb/t_rw:.2f} TB/s); copy {t_c:.3f}; gemm {t_g:.3f} ms")
        side = torch.cuda.Stream(priority=-1)
        main = torch.cuda.current_stream()
        Lb = torch.empty_like(L)
        for order in ("gemm first", "side first"):
            def both():
                side.wait_stream(main)
                if order == "side first":
                    with torch.cuda.stream(side): liger(L2)
                    torch.matmul(x, W.t(), out=Lb)
                else:
                    torch.matmul(x, W.t(), out=Lb)
                    with torch.cuda.stream(side): liger(L2)
                main.wait_stream(side)
            t_b = ev(both)
            print(f"  overlap ({order}): gemm + liger {t_b:.3f} ms vs serial {t_g + t_l - t_c:.3f} ms")
        # amax on side stream as a pure read kernel
        def both_r():
            side.wait_stream(main)
            torch.matmul(x, W.t(), out=Lb)
            with torch.cuda.stream(side): torch.amax(L2, dim=1)
            main.wait_stream(side)
        print(f"  overlap gemm + amax {ev(both_r):.3f} ms vs serial {t_g + t_r:.3f}")


def gemms(W):
    N = 32768
    X = torch.randn(N, H, device=dev, dtype=torch.bfloat16)
    dX = torch.empty_like(X)
    ev = lambda fn: ev_time(fn, reps=5, warm=2)
    bufs = {r: torch.empty(r, V, device=dev, dtype=torch.bfloat16) for r in (512, 1024, 2048, 4096)}
    for rnd in range(2):
        print("floor", round(ev(lambda: torch.matmul(X, W.t())), 1))
        for r, L in bufs.items():
            def g1():
                for s in range(0, N, r): torch.matmul(X[s:s+r], W.t(), out=L)
            def g2():
                for s in range(0, N, r): torch.mm(L, W, out=dX[s:s+r])
            def both():
                for s in range(0, N, r):
                    torch.matmul(X[s:s+r], W.t(), out=L); torch.mm(L, W, out=dX[s:s+r])
            print(f"rows {r}: GEMM1 {ev(g1):.1f} ms  GEMM2 {ev(g2):.1f} ms  both {ev(both):.1f} ms")
    # Liger in flow, profiled
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    Xg = X.clone().requires_grad_(True)
    y = torch.randint(0, V, (N,), device=dev); y.masked_fill_(torch.rand(N, device=dev) < 0.1, -100)
    def liger():
        Xg.grad = None
        out = LigerFusedLinearCrossEntropyFunction.apply(Xg, W, y, None, None, -100, 0.0, 0.0, "mean")
        (out[0] if isinstance(out, tuple) else out).backward()
    print("liger", round(ev(liger), 1))
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        liger(); torch.cuda.synchronize()
    tot = {}
    for e in p.events():
        if e.device_type.name == "CUDA":
            k = e.name[:60]; t, c = tot.get(k, (0.0, 0)); tot[k] = (t + e.device_time / 1e3, c + 1)
    for k, (t, c) in sorted(tot.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f"  {t:8.2f} ms {c:4d} x {k}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("overlap", "gemms"):
        sys.exit("usage: lm_head_loss_probes.py overlap|gemms LIGER_DIR")
    sys.path.insert(0, sys.argv[2])
    torch.manual_seed(0)
    W = (torch.randn(V, H, device=dev, dtype=torch.bfloat16) / H ** 0.5)
    {"overlap": overlap, "gemms": gemms}[sys.argv[1]](W)
