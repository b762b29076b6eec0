#!/usr/bin/env python3
"""Where a training step's device time goes, from a Chrome trace of LibTorch's
profiler (bench/kineto_trace.h; drafter_bench --trace).

Sums the device time of every kernel, copy and memset by kind (GEMM,
attention, loss, optimizer, element-wise, copies) and by kernel name, beside
the window from the first to the last piece of device work and its idle time.

  scripts/trace_kernels.py TRACE.json [--top 25]
"""
import argparse
import collections
import json

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}

# First match wins: a kernel's kind from its (demangled) name.
# Our own kernels first: their namespace (dflash::) contains "flash".
KINDS = [
    ("loss", ("row_statistics", "gradient_and_kl")),
    ("fused layer ops", ("rms_norm", "qk_norm", "head_norm", "swiglu")),
    # Before attention: our AdamW kernel's namespace (dflash::) has "flash".
    ("optimizer", ("adam", "multi_tensor", "foreach", "norm_kernel", "lpnorm")),
    ("attention", ("cudnn", "fmha", "flash", "attention", "sdpa", "efficient")),
    ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "matmul", "splitk")),
    ("copies", ("memcpy", "memset", "copy", "cat", "index", "gather", "scatter")),
]


def kind_of(event):
    if event.get("cat") != "kernel":
        return "copies"
    name = event["name"].lower()
    for kind, keys in KINDS:
        if any(k in name for k in keys):
            return kind
    return "other element-wise"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    with open(a.trace) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS and "dur" in e]
    if not device:
        raise SystemExit(f"{a.trace}: no device events (was the profiler built with CUDA?)")
    start = min(e["ts"] for e in device)
    end = max(e["ts"] + e["dur"] for e in device)
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in device)
    busy, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    window = end - start
    print(f"window {window / 1000:.1f} ms, device busy {busy / 1000:.1f} ms, idle {(window - busy) / 1000:.1f} ms")
    by_kind = collections.Counter()
    by_name = collections.Counter()
    calls = collections.Counter()
    for e in device:
        by_kind[kind_of(e)] += e["dur"]
        by_name[e["name"]] += e["dur"]
        calls[e["name"]] += 1
    total = sum(by_kind.values())
    print("by kind (sum of device time; overlapping work counts twice):")
    for kind, us in by_kind.most_common():
        print(f"  {kind:20s} {us / 1000:8.1f} ms  {100 * us / total:5.1f} %")
    print(f"top {a.top} kernels:")
    for name, us in by_name.most_common(a.top):
        print(f"  {us / 1000:8.1f} ms  {calls[name]:5d} x  {kind_of({'cat': 'kernel', 'name': name}):18s} {name[:140]}")


if __name__ == "__main__":
    main()
