#!/usr/bin/env python3
"""The suite mirrors the source (docs/architecture.md, "Tests"): tests/core/<room>/
for each room of core/ it tests, tests/plugins/<kind>/[<name>/] for in-tree
plugins and plugins/shared/<part>/, tests/sdk/ for the SDK; tests/fixtures/ for
what tests read, tests/support/ for shared helpers, tests/docs/ and
tests/structure/ for the checks. Each folder holding a test source
(*_test.cpp) builds it with its own CMakeLists.txt, which the suite adds.

  check_tests_mirror_source.py <source dir>
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
tests = root / "tests"
problems = []

allowed_top = {"core", "plugins", "sdk", "fixtures", "support", "docs", "structure"}
for entry in sorted(tests.iterdir()):
    if entry.is_dir() and entry.name not in allowed_top:
        problems.append(f"tests/{entry.name}/ is none of tests/{{{', '.join(sorted(allowed_top))}}}/")
    if entry.is_file() and entry.suffix in (".cpp", ".h", ".py", ".sh"):
        problems.append(f"tests/{entry.name} lies at the top of tests/: put it in the folder of what it tests")

for room in sorted(p for p in (tests / "core").iterdir() if p.is_dir()):
    if not (root / "core" / room.name).is_dir():
        problems.append(f"tests/core/{room.name}/ tests no room: core/{room.name}/ does not exist")

for folder in sorted(p for p in (tests / "plugins").rglob("*") if p.is_dir()):
    relative = folder.relative_to(tests / "plugins")
    if not (root / "plugins" / relative).is_dir():
        problems.append(f"tests/plugins/{relative}/ tests nothing in tree: plugins/{relative}/ does not exist")

# Which folders the suite's CMakeLists files add (add_subdirectory, with the
# loop over core rooms spelled out in tests/CMakeLists.txt).
added = set()
for cmake in tests.rglob("CMakeLists.txt"):
    text = cmake.read_text()
    base = cmake.parent
    for match in re.finditer(r"foreach\(\w+ IN ITEMS ([^)]*)\)\s*add_subdirectory\(([\w/]*)\$\{\w+\}\)", text):
        for name in match.group(1).split():
            added.add((base / (match.group(2) + name)).resolve())
    for match in re.finditer(r"add_subdirectory\(([\w/]+)\)", text):
        added.add((base / match.group(1)).resolve())

for source in sorted(tests.rglob("*_test.cpp")):
    folder = source.parent
    where = folder.relative_to(root)
    if "node_modules" in folder.parts:
        continue
    if not (folder / "CMakeLists.txt").is_file():
        problems.append(f"{where}/ holds {source.name} but no CMakeLists.txt of its own")
    elif folder.resolve() not in added and folder != tests:
        problems.append(f"{where}/CMakeLists.txt is not added by the suite (add_subdirectory)")
    elif source.name not in (folder / "CMakeLists.txt").read_text():
        problems.append(f"{where}/CMakeLists.txt does not build {source.name}")

if problems:
    print("\n".join(problems))
    sys.exit(f"check_tests_mirror_source: the suite's folders disagree with the source in {len(problems)} places")
print("check_tests_mirror_source: the suite mirrors the source")
