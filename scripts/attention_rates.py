#!/usr/bin/env python3
"""Attention kernel rates at the drafter's group shapes, on the GPU machine:
cuDNN with the additive mask the grouped path passes, cuDNN and flash without
a mask, and the same with fewer keys (a masked tail). Forward and forward +
backward, TFLOP/s counted over every query-key pair computed, from the
kernels' device time (every kernel of the call: the attention kernels and
the small ones around them).

    python3 scripts/attention_rates.py [--queries 1024] [--keys 5120 1536]
"""
import argparse
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def timed(fn, repeats=20):
    """Milliseconds of device time per call: the kernels' own durations under
    the profiler, so that small cases are not bounded by the host's launches
    (wall-clock timing of a 0.1 ms kernel mostly measures Python)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    device_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    if device_us == 0:  # a profiler that reports kernels only under their host operators
        device_us = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages())
    return device_us / 1000.0 / repeats


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--queries", type=int, nargs="+", default=[1024, 256])
    p.add_argument("--keys", type=int, nargs="+", default=[5120, 1536, 8192])
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    a = p.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for Q in a.queries:
        for K in a.keys:
            q = torch.randn(1, a.heads, Q, a.head_dim, device=dev, dtype=dt, requires_grad=True)
            k = torch.randn(1, a.kv_heads, K, a.head_dim, device=dev, dtype=dt, requires_grad=True)
            v = torch.randn(1, a.kv_heads, K, a.head_dim, device=dev, dtype=dt, requires_grad=True)
            allowed = torch.rand(Q, K, device=dev) < 0.8
            bias = torch.zeros(1, 1, Q, K, device=dev, dtype=dt).masked_fill(~allowed, float("-inf"))
            g = torch.randn(1, a.heads, Q, a.head_dim, device=dev, dtype=dt)
            flop_fwd = 4.0 * a.heads * Q * K * a.head_dim
            for name, backend, mask in [("cudnn+mask", SDPBackend.CUDNN_ATTENTION, bias),
                                        ("cudnn", SDPBackend.CUDNN_ATTENTION, None),
                                        ("flash", SDPBackend.FLASH_ATTENTION, None),
                                        ("efficient+mask", SDPBackend.EFFICIENT_ATTENTION, bias)]:
                def fwd():
                    with torch.no_grad(), sdpa_kernel([backend]):
                        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

                def both():
                    with sdpa_kernel([backend]):
                        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                    torch.autograd.grad(out, (q, k, v), g)
                try:
                    f, b = timed(fwd), timed(both)
                    print(f"Q {Q:5d} K {K:5d} {name:15s} fwd {f:7.3f} ms {flop_fwd / f / 1e9:6.0f} TFLOP/s; "
                          f"fwd+bwd {b:7.3f} ms {3.5 * flop_fwd / b / 1e9:6.0f} TFLOP/s")
                except Exception as e:  # a backend that does not take this case
                    print(f"Q {Q:5d} K {K:5d} {name:15s} unavailable: {str(e).splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
