#!/usr/bin/env python3
"""docs/architecture.md's map stays true: its rooms table lists exactly the
folders of core/, its plugin tables every plugin folder and every folder of
plugins/shared/, and its commands table every command dflash-host takes (the
names in core/cli/cli_options.cpp's kCommands, and launch).

  check_architecture_map.py <source dir>
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
page = (root / "docs/architecture.md").read_text()
problems = []


def section(title):
    match = re.search(r"^## " + re.escape(title) + r"\n(.*?)(?=^## |\Z)", page, re.S | re.M)
    if not match:
        sys.exit(f"check_architecture_map: docs/architecture.md has no section '## {title}'")
    return match.group(1)


def first_cells(text):
    return [row.split("|")[1].strip() for row in text.splitlines() if row.startswith("| ") and not row.startswith("| ---")]


rooms_text = section("Rooms")
listed_rooms = set(re.findall(r"^\| `core/([a-z_]+)/`", rooms_text, re.M))
actual_rooms = {p.name for p in (root / "core").iterdir() if p.is_dir()}
for room in sorted(actual_rooms - listed_rooms):
    problems.append(f"core/{room}/ exists but the Rooms table does not list it")
for room in sorted(listed_rooms - actual_rooms):
    problems.append(f"the Rooms table lists core/{room}/, which does not exist")

for kind in ("data", "target", "drafter", "loss", "scheduler"):
    for plugin in sorted(p for p in (root / "plugins" / kind).iterdir() if p.is_dir()):
        if f"`plugins/{kind}/{plugin.name}`" not in rooms_text:
            problems.append(f"plugins/{kind}/{plugin.name} exists but the in-tree plugins table does not list it")
for listed in re.findall(r"`plugins/(data|target|drafter|loss|scheduler)/([a-z_0-9]+)`", rooms_text):
    if not (root / "plugins" / listed[0] / listed[1]).is_dir():
        problems.append(f"the map lists plugins/{listed[0]}/{listed[1]}, which does not exist")
for shared in sorted(p.name for p in (root / "plugins/shared").iterdir() if p.is_dir()):
    if f"`{shared}`" not in rooms_text:
        problems.append(f"plugins/shared/{shared} exists but the map's plugins/shared/ row does not name it")

commands = set(re.findall(r'"([a-z]+)"', re.search(r"kCommands\[\] = \{([^}]*)\}",
                                                       (root / "core/cli/cli_options.cpp").read_text()).group(1)))
commands.add("launch")
command_cells = " ".join(first_cells(section("Commands and what flows through the rooms")))
listed_commands = set(re.findall(r"`([a-z]+)`", command_cells))
for command in sorted(commands - listed_commands):
    problems.append(f"dflash-host takes '{command}' but the commands table does not list it")
for command in sorted(listed_commands - commands):
    problems.append(f"the commands table lists '{command}', which dflash-host does not take")

if problems:
    print("\n".join(problems))
    sys.exit(f"check_architecture_map: docs/architecture.md disagrees with the tree in {len(problems)} places")
print(f"check_architecture_map: {len(actual_rooms)} rooms, the plugins and {len(commands)} commands, all on the map")
