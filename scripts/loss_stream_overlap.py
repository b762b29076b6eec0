#!/usr/bin/env python3
"""Probe for issue 20's loss lever "the softmax passes overlapped with the next
chunk's GEMM", at the DFlash lm_head shape (H 5120, V 248,320, bf16), on the
GPU machine. For chunks of 1024 and 2048 rows it times: Liger-Kernel's
cross-entropy kernel alone on a chunk of logits (its two passes in one
launch); a pure read (amax) and a read + write (mul_) of the chunk as
bandwidth references; the chunk's logits GEMM alone; and the GEMM on the
default stream beside Liger's kernel (or the read) on a high-priority side
stream, launched in either order, against the two run one after the other.

    python3 scripts/loss_stream_overlap.py LIGER_DIR   (a folder holding liger_kernel)

Figures of 2026-12-04 are in docs/performance.md ("Issue 20's loss targets").
"""
import sys, statistics, torch
sys.path.insert(0, sys.argv[1])
from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel
dev = "cuda"; V = 248320; H = 5120
torch.manual_seed(0)
W = (torch.randn(V, H, device=dev, dtype=torch.bfloat16) / H ** 0.5)
def ev_time(fn, reps=10, warm=3):
    ts = []
    for i in range(warm + reps):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(); s.record(); fn(); e.record(); torch.cuda.synchronize()
        if i >= warm: ts.append(s.elapsed_time(e))
    return statistics.median(ts)
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
    t_l = ev_time(lambda: (L.copy_(L2), liger()))  # copy restores logits (liger overwrites)
    t_c = ev_time(lambda: L.copy_(L2))
    t_r = ev_time(lambda: torch.amax(L2, dim=1))
    t_rw = ev_time(lambda: L2.mul_(1.0))
    t_g = ev_time(lambda: torch.matmul(x, W.t(), out=L))
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
        t_b = ev_time(both)
        print(f"  overlap ({order}): gemm + liger {t_b:.3f} ms vs serial {t_g + t_l - t_c:.3f} ms")
    # amax on side stream as a pure read kernel
    def both_r():
        side.wait_stream(main)
        torch.matmul(x, W.t(), out=Lb)
        with torch.cuda.stream(side): torch.amax(L2, dim=1)
        main.wait_stream(side)
    print(f"  overlap gemm + amax {ev_time(both_r):.3f} ms vs serial {t_g + t_r:.3f}")
