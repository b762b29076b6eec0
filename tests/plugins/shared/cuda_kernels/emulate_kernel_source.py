#!/usr/bin/env python3
"""A CUDA source rewritten to run on the CPU (tests/support/cuda_emulation/):
each mma.m16n8k16 inline-assembly statement becomes cuda_emulation::mma_16x8x16
of its element type, each kernel<<<grid, threads, shared, stream>>>(args)
launch becomes cuda_emulation::launch(kernel, dim3(grid), threads, args), and
each `extern __shared__ [__align__(N)] type name[];` (dynamic shared memory)
a pointer to the running block's own cuda_emulation::kDynamicSharedBytes
bytes (1024-aligned; the shared window, address 0 of the descriptors
wgmma.cuh reads). Everything else is the source as it is. Fails, naming the file, where a statement it does not
know is left (other inline assembly, another launch form).

  emulate_kernel_source.py <kernel.cu> <out.cpp>
"""
import re
import sys

source_path, out_path = sys.argv[1], sys.argv[2]
text = open(source_path, encoding="utf-8").read()


def mma(match):
    kind = "__nv_bfloat16" if ".bf16.bf16." in match.group(0) else "__half"
    return f"cuda_emulation::mma_16x8x16<{kind}>(d, a, b);\n"


text, mmas = re.subn(r'asm volatile\("mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.[^"]*".*?\);\n', mma, text,
                     flags=re.S)
text, launches = re.subn(r"([\w:]+(?:<[\w, ]+>)?)<<<(.+?), ([^,<>]+), [^,<>]+, stream>>>\(",
                         r"cuda_emulation::launch(\1, dim3(\2), \3, ", text, flags=re.S)
text = re.sub(r"extern __shared__ (?:__align__\((\d+)\) )?(\w+(?: \w+)?) (\w+)\[\];",
              lambda m: f"{m.group(2)}* const {m.group(3)} = cuda_emulation::dynamic_shared<{m.group(2)}>();", text)
problems = []
if launches == 0:
    problems.append("found no launch of the form kernel<<<grid, threads, shared, stream>>>(")
if "asm" in text:
    problems.append("inline assembly other than mma.m16n8k16 is left")
if "extern __shared__" in text:
    problems.append("an extern __shared__ array not of the form `extern __shared__ [__align__(N)] type name[];`")
if "<<<" in text:
    problems.append("a launch not of the form kernel<<<grid, threads, 0, stream>>>( is left")
if problems:
    sys.exit(f"emulate_kernel_source.py: {source_path}: " + "; ".join(problems))
header = (f"// Generated from {source_path} by emulate_kernel_source.py for the CPU emulation; do not edit.\n"
          '#include "emulated_mma.h"\n')
open(out_path, "w", encoding="utf-8").write(header + text)
print(f"{out_path}: {mmas} mma statements, {launches} launches emulated")
