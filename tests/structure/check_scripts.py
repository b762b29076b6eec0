#!/usr/bin/env python3
"""scripts/ stays usable after a move: every scripts/... path that a script,
the README or a page of docs/ names exists (the dated history and raw bench
output excepted: they tell what was true then); every device task
(scripts/device/TASK.sh) has its header (what it runs, what to carry), parses
(bash -n), finds the repository from its own place rather than from the
caller's folder, and is listed by `scripts/device.sh list`.

  check_scripts.py <source dir>
"""
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(sys.argv[1])
problems = []

named = re.compile(r"\bscripts/[A-Za-z0-9_./-]+\.(?:sh|py)\b")
sources = [root / "README.md"] + sorted((root / "docs").glob("*.md")) + sorted((root / "scripts").rglob("*.sh")) + \
    sorted((root / "scripts").rglob("*.py")) + sorted((root / "tests").rglob("CMakeLists.txt"))
for source in sources:
    if "node_modules" in source.parts:
        continue
    for number, line in enumerate(source.read_text(errors="replace").splitlines(), 1):
        for path in named.findall(line):
            if pathlib.PurePath(path).stem.isupper():  # a placeholder: scripts/device/TASK.sh
                continue
            if not (root / path).is_file():
                problems.append(f"{source.relative_to(root)}:{number} names {path}, which does not exist")

tasks = sorted((root / "scripts/device").glob("*.sh"))
if not tasks:
    problems.append("scripts/device/ holds no task")
listing = subprocess.run(["bash", str(root / "scripts/device.sh"), "list"], capture_output=True, text=True)
if listing.returncode != 0:
    problems.append(f"scripts/device.sh list failed: {listing.stderr.strip()}")
listed = {line.strip() for line in listing.stdout.splitlines() if line and not line.startswith(" ")}
for task in tasks:
    name = task.stem
    text = task.read_text()
    lines = text.splitlines()
    if len(lines) < 3 or not all(line.startswith("#") for line in lines[1:3]):
        problems.append(f"scripts/device/{task.name} has no header (lines 2-3: what it runs, what a call carries)")
    if name not in listed:
        problems.append(f"scripts/device.sh list does not list {name}")
    parsed = subprocess.run(["bash", "-n", str(task)], capture_output=True, text=True)
    if parsed.returncode != 0:
        problems.append(f"scripts/device/{task.name} does not parse: {parsed.stderr.strip()}")
    if '$(dirname "$0")/../..' not in text:
        problems.append(f"scripts/device/{task.name} does not find the repository from its own place "
                        '($(dirname "$0")/../..): it would depend on the caller\'s folder')

if problems:
    print("\n".join(problems))
    sys.exit(f"check_scripts: {len(problems)} problems")
print(f"check_scripts: {len(tasks)} device tasks, every named script present")
