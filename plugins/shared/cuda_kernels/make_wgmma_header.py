#!/usr/bin/env python3
"""Writes wgmma.cuh: Hopper's warpgroup MMA for the invariant linear, as
device functions. wgmma_mma<T, N> wraps wgmma.mma_async m64nNk16 (fp32 +=
T x T, T bf16 or fp16, both operands from shared-memory descriptors,
K-major, always accumulating) for each N = 8 ... 256: N is an immediate of
the instruction and the N/2 accumulators a thread holds are its operands, so
each N is its own function. The fences, commit and wait beside them.
tests/support/cuda_emulation/wgmma.cuh is the CPU's version of the same
functions.

  make_wgmma_header.py [out.cuh]
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "wgmma.cuh")
lines = [
    "// Hopper's warpgroup MMA (wgmma), sm_90a only; elsewhere each function traps.",
    "// Written by make_wgmma_header.py; do not edit. The CPU emulation's version:",
    "// tests/support/cuda_emulation/wgmma.cuh.",
    "#pragma once",
    "",
    "#include <cuda_bf16.h>",
    "#include <cuda_fp16.h>",
    "",
    "#include <cstdint>",
    "",
    "namespace dflash::cuda_kernels {",
    "",
    "#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)",
    "#define DFLASH_WGMMA_ASM(...) asm volatile(__VA_ARGS__)",
    "#else",
    "#define DFLASH_WGMMA_ASM(...) __trap()",
    "#endif",
    "",
    "// A shared-memory matrix descriptor, no swizzle: lbo bytes between core",
    "// matrices (8 rows of 16 bytes) adjacent in k, sbo between those adjacent in",
    "// rows.",
    "__device__ __forceinline__ uint64_t wgmma_descriptor(const void* p, uint32_t lbo, uint32_t sbo) {",
    "  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));",
    "  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |",
    "         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32);",
    "}",
    "// The same for the 128-byte swizzle, K-major: rows of 128 bytes (64 of k in",
    "// 16-bit elements) in atoms of 8 rows (1024 bytes, 1024-aligned), a row's",
    "// 16-byte chunk c at chunk c ^ (row % 8); sbo bytes between atoms of rows.",
    "// A product's 16 of k further on: the start address 32 bytes further on.",
    "__device__ __forceinline__ uint64_t wgmma_descriptor_swizzled_128(const void* p, uint32_t sbo) {",
    "  return wgmma_descriptor(p, 16, sbo) | (uint64_t{1} << 62);",
    "}",
    '__device__ __forceinline__ void wgmma_fence() { DFLASH_WGMMA_ASM("wgmma.fence.sync.aligned;\\n" ::: "memory"); }',
    '__device__ __forceinline__ void wgmma_commit() { DFLASH_WGMMA_ASM("wgmma.commit_group.sync.aligned;\\n" ::: "memory"); }',
    '__device__ __forceinline__ void wgmma_wait_all() { DFLASH_WGMMA_ASM("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory"); }',
    "// Waits until at most N of this warpgroup's committed groups are still running.",
    "template <int N>",
    "__device__ __forceinline__ void wgmma_wait_prior() {",
    '  DFLASH_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\\n" ::"n"(N) : "memory");',
    "}",
    "// This thread's generic-proxy writes to shared memory (cp.async, stores),",
    "// made visible to the async proxy the tensor cores read through.",
    "__device__ __forceinline__ void fence_proxy_async_shared() {",
    '  DFLASH_WGMMA_ASM("fence.proxy.async.shared::cta;\\n" ::: "memory");',
    "}",
    "// The accumulators as an asm's operands: placed before wgmma_fence and after",
    "// wgmma_wait_all, it keeps the compiler from moving their reads or writes",
    "// across the asynchronous products, which it cannot see.",
    "template <int N>",
    "__device__ __forceinline__ void wgmma_hold(float* d) {",
    "#pragma unroll",
    "  for (int i = 0; i < N / 2; ++i) asm volatile(\"\" : \"+f\"(d[i])::\"memory\");",
    "}",
    "",
    "template <class T, int N>",
    "__device__ __forceinline__ void wgmma_mma(float* d, uint64_t desc_a, uint64_t desc_b);",
]
for t, ptx in (("__nv_bfloat16", "bf16"), ("__half", "f16")):
    for n in range(8, 257, 8):
        regs = n // 2
        outs = ", ".join("%%%d" % i for i in range(regs))
        constraints = ", ".join('"+f"(d[%d])' % i for i in range(regs))
        lines += [
            "template <>",
            "__device__ __forceinline__ void wgmma_mma<%s, %d>(float* d, uint64_t desc_a, uint64_t desc_b) {" % (t, n),
            '  DFLASH_WGMMA_ASM("{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n"' % (regs + 2),
            '                   "wgmma.mma_async.sync.aligned.m64n%dk16.f32.%s.%s {%s}, %%%d, %%%d, p, 1, 1, 0, 0;\\n}\\n"'
            % (n, ptx, ptx, outs, regs, regs + 1),
            "                   : %s" % constraints,
            '                   : "l"(desc_a), "l"(desc_b), "r"(1));',
            "}",
        ]
lines += ["", "#undef DFLASH_WGMMA_ASM", "", "}  // namespace dflash::cuda_kernels", ""]
with open(out_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
