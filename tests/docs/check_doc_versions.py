#!/usr/bin/env python3
"""Every place the docs state the *current* plugin ABI or host version agrees
with the one definition: DFLASH_ABI_MAJOR/MINOR in sdk/include/dflash/abi.h and
project(... VERSION) in CMakeLists.txt. Historical mentions ("added in ABI
1.2", "ABI 1.1's decoding slots") are not claims about now and are left alone.

  check_doc_versions.py <source dir>
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
abi_h = (root / "sdk/include/dflash/abi.h").read_text()
abi = "{}.{}".format(re.search(r"#define DFLASH_ABI_MAJOR (\d+)", abi_h).group(1),
                     re.search(r"#define DFLASH_ABI_MINOR (\d+)", abi_h).group(1))
host = re.search(r"project\(dflash-host VERSION (\d+\.\d+\.\d+)", (root / "CMakeLists.txt").read_text()).group(1)

# Each pattern's group 1 claims the current ABI (or, for the last, the host version).
claims = [
    (re.compile(r"MAJOR\.MINOR` \(now (\d+\.\d+)"), abi, "the ABI version the docs call current"),
    (re.compile(r"plugin ABI (\d+\.\d+),"), abi, "dflash-host --version output"),
    (re.compile(r"this host speaks ABI (\d+\.\d+)"), abi, "a loader message quoting the host's ABI"),
    (re.compile(r"^\s*ABI:\s+(\d+\.\d+)\s*$"), abi, "`describe` output of a plugin built against the current SDK"),
    (re.compile(r"^(?:data|target|drafter|loss|scheduler)\s+\S+\s+\d+\.\d+\.\d+\s+(\d+\.\d+)\s+/"), abi,
     "`list` output of a plugin built against the current SDK"),
    (re.compile(r"dflash-host (\d+\.\d+\.\d+), plugin ABI"), host, "dflash-host --version output"),
]

files = sorted((root / "docs").glob("*.md")) + [root / "README.md"]
problems = []
checked = 0
for path in files:
    if path.name == "abi-changelog.md":  # the history itself
        continue
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for pattern, want, what in claims:
            for match in pattern.finditer(line):
                checked += 1
                if match.group(1) != want:
                    problems.append(f"{path.relative_to(root)}:{number}: {what} says {match.group(1)}, "
                                    f"but the source says {want}: {line.strip()}")
for problem in problems:
    print(problem)
if problems:
    sys.exit(1)
if checked < 5:
    print(f"only {checked} version claims found: the patterns no longer match the docs; update this check")
    sys.exit(1)
print(f"{checked} version claims in the docs agree with ABI {abi} and dflash-host {host}")
