#!/usr/bin/env python3
"""Writes wgmma_shapes.cuh: one inline-assembly wrapper of Hopper's
wgmma.mma_async m64nNk16 (fp32 += bf16 x bf16, both operands from shared
memory descriptors, K-major, always accumulating) for each N = 8 ... 256, the
row counts a warpgroup's instruction can take. N must be an immediate of the
instruction, and the N/2 accumulators a thread holds are its operands, so
each N is its own function.

  make_wgmma_shapes.py [out.cuh]
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "wgmma_shapes.cuh")
lines = [
    "// wgmma.mma_async m64nNk16 for N = 8 ... 256: fp32 += bf16 x bf16, A and B from shared-memory",
    "// descriptors, both K-major, always accumulating (scale-d true). d: N/2 floats a thread.",
    "// Written by make_wgmma_shapes.py; do not edit.",
    "#pragma once",
    "#include <cstdint>",
    "",
    "template <int N>",
    "__device__ __forceinline__ void wgmma_bf16(float* d, uint64_t desc_a, uint64_t desc_b);",
    "",
]
for n in range(8, 257, 8):
    regs = n // 2
    outs = ", ".join("%%%d" % i for i in range(regs))
    constraints = ", ".join('"+f"(d[%d])' % i for i in range(regs))
    lines += [
        "template <>",
        "__device__ __forceinline__ void wgmma_bf16<%d>(float* d, uint64_t desc_a, uint64_t desc_b) {" % n,
        '  asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n"' % (regs + 2),
        '               "wgmma.mma_async.sync.aligned.m64n%dk16.f32.bf16.bf16 {%s}, %%%d, %%%d, p, 1, 1, 0, 0;\\n}\\n"'
        % (n, outs, regs, regs + 1),
        "               : %s" % constraints,
        '               : "l"(desc_a), "l"(desc_b), "r"(1));',
        "}",
    ]
with open(out_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
