#!/usr/bin/env python3
"""The rooms of core/ as the build declares them: each library names the
libraries it uses (core/CMakeLists.txt and the rooms' own CMakeLists), and
every #include "room/file.h" in core/ must land in the includer's own
library or one it uses, directly or through others. The libraries' use graph
has no loop. A header with no source of its own belongs to its folder's
library (or the dflash-host executable for cli/).

  check_room_includes.py <source dir>
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
core = root / "core"
libraries = {}   # name -> {"sources": set of stems (core-relative, no suffix), "uses": set}


def strip_comments(text):
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def words(text):
    return text.replace("\n", " ").split()


for cmake in [core / "CMakeLists.txt"] + sorted(core.glob("*/CMakeLists.txt")):
    folder = cmake.parent.relative_to(core)
    text = strip_comments(cmake.read_text())
    prefix = "" if str(folder) == "." else str(folder) + "/"
    for name in re.findall(r"add_library\((\w+)\s+INTERFACE\s*\)", text):
        libraries.setdefault(name, {"sources": set(), "uses": set()})
    for name, body in re.findall(r"add_library\((\w+)\s+STATIC\s+([^)]*)\)", text):
        libraries.setdefault(name, {"sources": set(), "uses": set()})
        for src in words(body):
            if src.endswith((".cpp", ".cu")):
                libraries[name]["sources"].add(prefix + src.rsplit(".", 1)[0])
    for name, body in re.findall(r"add_executable\(([\w-]+)\s+([^)]*)\)", text):
        libraries.setdefault(name, {"sources": set(), "uses": set()})
        for src in words(body):
            if src.endswith(".cpp"):
                libraries[name]["sources"].add(prefix + src.rsplit(".", 1)[0])
    for name, body in re.findall(r"dflash_core_room\((\w+)\s+([^)]*)\)", text):
        lib = "dflash_" + name
        parts = words(body)
        entry = libraries.setdefault(lib, {"sources": set(), "uses": set()})
        mode = None
        for part in parts:
            if part in ("SOURCES", "USES"):
                mode = part
            elif mode == "SOURCES":
                entry["sources"].add(prefix + part.rsplit(".", 1)[0])
            elif mode == "USES":
                entry["uses"].add(part)
    for name, body in re.findall(r"target_link_libraries\(([\w-]+)\s+([^)]*)\)", text):
        if name in libraries:
            libraries[name]["uses"].update(w for w in words(body) if w not in ("PUBLIC", "PRIVATE", "INTERFACE"))
    for name, body in re.findall(r"target_sources\((\w+)\s+PRIVATE\s+([^)]*)\)", text):
        if name in libraries:
            for src in words(body):
                if src.endswith((".cpp", ".cu")):
                    libraries[name]["sources"].add(prefix + src.rsplit(".", 1)[0])

owner_of_stem = {}
for name, lib in libraries.items():
    for stem in lib["sources"]:
        owner_of_stem[stem] = name

files = sorted(p for p in core.rglob("*") if p.suffix in (".cpp", ".h", ".cu"))


def owner(path):
    rel = str(path.relative_to(core)).rsplit(".", 1)[0]
    if rel in owner_of_stem:
        return owner_of_stem[rel]
    # A header alone: its folder's library (the one owning most of the folder's sources).
    folder = str(path.parent.relative_to(core))
    counts = {}
    for stem, name in owner_of_stem.items():
        if stem.rsplit("/", 1)[0] == folder:
            counts[name] = counts.get(name, 0) + 1
    return max(counts, key=counts.get) if counts else None


core_libraries = set(libraries)


def reach(name, seen=None):
    seen = set() if seen is None else seen
    for used in libraries.get(name, {}).get("uses", ()):
        if used in core_libraries and used not in seen:
            seen.add(used)
            reach(used, seen)
    return seen


problems = []
# The use graph has no loop.
for name in sorted(core_libraries):
    if name in reach(name):
        problems.append(f"{name} uses itself through others: a loop between rooms")
# Every include lands in the includer's library or one it reaches.
for path in files:
    mine = owner(path)
    if mine is None:
        problems.append(f"{path.relative_to(root)}: no library of the build holds it or its folder")
        continue
    allowed = {mine} | reach(mine)
    for target in re.findall(r'^\s*#include "([a-z_0-9/]+\.h)"', path.read_text(), re.M):
        target_path = core / target
        if not target_path.exists():
            continue  # a plugin's or the SDK's header, not a room of core/
        theirs = owner(target_path)
        if theirs not in allowed:
            problems.append(f"{path.relative_to(root)} ({mine}) includes {target} ({theirs}), which {mine} does not use")

if problems:
    print("\n".join(problems))
    sys.exit(f"check_room_includes: {len(problems)} includes or uses break the rooms the build declares")
print(f"check_room_includes: {len(files)} files of core/ in {len(core_libraries)} libraries, every include within what "
      "its library uses, no loop")
