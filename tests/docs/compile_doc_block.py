#!/usr/bin/env python3
"""Compiles the first ```cpp block under a heading of a Markdown file, so code
the docs show stays code that builds.

  compile_doc_block.py <file.md> "<heading line start>" <compiler and flags...>
"""
import pathlib
import subprocess
import sys
import tempfile

markdown, heading, compiler = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
lines = markdown.read_text().splitlines()
try:
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    open_fence = next(i for i in range(start, len(lines)) if lines[i].strip() == "```cpp")
    close_fence = next(i for i in range(open_fence + 1, len(lines)) if lines[i].strip() == "```")
except StopIteration:
    sys.exit(f"{markdown}: no ```cpp block under a heading starting with '{heading}'")
code = "\n".join(lines[open_fence + 1:close_fence]) + "\n"
with tempfile.NamedTemporaryFile("w", suffix=".cpp") as source:
    source.write(code)
    source.flush()
    result = subprocess.run(compiler + [source.name], capture_output=True, text=True)
if result.returncode != 0:
    print(result.stdout + result.stderr)
    sys.exit(f"{markdown}:{open_fence + 2}: the block under '{heading}' does not compile")
print(f"{markdown}:{open_fence + 2}: the block under '{heading}' compiles ({close_fence - open_fence - 1} lines)")
