#!/usr/bin/env python3
"""Where a decode's device time goes, from a Chrome trace of LibTorch's
profiler (bench/kineto_trace.h; decode_bench --trace).

The device's work (kernels, copies, memsets) is laid on one time line: busy
time is their union, the rest of the window is idle, and every idle gap is
charged to the host operator that was running when the gap began (the host
had not yet launched the next piece of work). Steps are cut at the host's
device-to-host copies (a decode's one wait per step).

  scripts/trace_gaps.py TRACE.json [--top 15] [--timeline STEP]

--timeline STEP prints that step's events in time order (host operators and
runtime calls, device work), in microseconds from the step's start: what the
host was doing while the device waited.
"""
import argparse
import bisect
import collections
import json

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def load(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--timeline", type=int, default=-1, help="print the events of this step (0-based)")
    a = ap.parse_args()
    events = load(a.trace)
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    if not device:
        print(f"{a.trace}: no device events (a CPU run, or the profiler saw no CUDA activity)")
        return
    host_ops = sorted((e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")),
                      key=lambda e: e["ts"])
    starts = [e["ts"] for e in host_ops]
    busy = union([(e["ts"], e["ts"] + e["dur"]) for e in device])
    window = busy[-1][1] - busy[0][0]
    busy_us = sum(end - start for start, end in busy)
    # Steps: device-to-host copies end them.
    d2h = sorted(e["ts"] for e in device if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", ""))
    kernels = [e for e in device if e.get("cat") == "kernel"]
    print(f"{a.trace}")
    print(f"  window {window / 1e3:.3f} ms, device busy {busy_us / 1e3:.3f} ms ({100 * busy_us / window:.1f}%),"
          f" {len(kernels)} kernels, {len(device) - len(kernels)} copies/memsets, {len(d2h)} device-to-host copies")
    if d2h:
        print(f"  per device-to-host copy (a step): window {window / len(d2h):.1f} us, busy {busy_us / len(d2h):.1f} us,"
              f" {len(kernels) / len(d2h):.1f} kernels")
    if 0 <= a.timeline < len(d2h) - 1:
        begin, end = d2h[a.timeline], d2h[a.timeline + 1]
        print(f"  step {a.timeline}: from one device-to-host copy to the next, {end - begin:.1f} us")
        inside = sorted((e for e in events if begin <= e["ts"] < end and e.get("cat") in DEVICE_CATS | {"cpu_op", "cuda_runtime"}),
                        key=lambda e: e["ts"])
        for e in inside:
            where = "device" if e.get("cat") in DEVICE_CATS else "host  "
            print(f"    {e['ts'] - begin:8.1f} +{e['dur']:7.1f}  {where}  {e['name'][:90]}")
    # Idle gaps, charged to the innermost host operator running at the gap's start.
    charged = collections.Counter()
    counts = collections.Counter()
    for (_, end), (nxt, _) in zip(busy, busy[1:]):
        gap = nxt - end
        if gap <= 0:
            continue
        name = "(no host operator)"
        best = None
        # The operators begun shortly before (scanning back a few hundred is enough for the innermost).
        for e in host_ops[max(0, bisect.bisect_right(starts, end) - 300):bisect.bisect_right(starts, end)]:
            if e["ts"] + e["dur"] >= end and (best is None or e["dur"] < best["dur"]):
                best = e
        if best is not None:
            name = f'{best.get("cat")}: {best["name"]}'
        charged[name] += gap
        counts[name] += 1
    idle = window - busy_us
    print(f"  idle {idle / 1e3:.3f} ms; by the host operator running when the device went idle:")
    for name, us in charged.most_common(a.top):
        print(f"    {us / 1e3:8.3f} ms  {counts[name]:6d} gaps  {name[:110]}")
    # The device's own time by kernel name.
    by_kernel = collections.Counter()
    n_kernel = collections.Counter()
    for e in device:
        by_kernel[e["name"]] += e["dur"]
        n_kernel[e["name"]] += 1
    print("  device time by kernel:")
    for name, us in by_kernel.most_common(a.top):
        print(f"    {us / 1e3:8.3f} ms  {n_kernel[name]:6d} x {us / n_kernel[name]:6.2f} us  {name[:100]}")


if __name__ == "__main__":
    main()
