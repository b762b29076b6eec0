#!/usr/bin/env python3
"""docs/training.md's exit-status table lists exactly the constants of
core/runtime/exit_codes.h, with their values (one definition, one table).

  check_exit_codes.py <source dir>
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
header = (root / "core/runtime/exit_codes.h").read_text()
defined = {name: int(value) for name, value in re.findall(r"inline constexpr int (kExit\w+) = (\d+);", header)}
table = (root / "docs/training.md").read_text()
documented = {name: int(value) for value, name in re.findall(r"^\|\s*(\d+)\s*\|\s*`(kExit\w+)`\s*\|", table, re.M)}
if not defined:
    sys.exit("check_exit_codes: no kExit constants found in core/runtime/exit_codes.h")
if defined != documented:
    for name in sorted(set(defined) | set(documented)):
        if defined.get(name) != documented.get(name):
            print(f"{name}: exit_codes.h says {defined.get(name)}, docs/training.md says {documented.get(name)}")
    sys.exit("check_exit_codes: docs/training.md's exit-status table disagrees with core/runtime/exit_codes.h")
print(f"check_exit_codes: {len(defined)} exit statuses, the same in both")
