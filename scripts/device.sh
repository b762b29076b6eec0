#!/usr/bin/env bash
# The GPU machine's one entry point: `scripts/device.sh TASK [ARGS...]` runs
# the task scripts/device/TASK.sh with ARGS; `scripts/device.sh list` lists
# the tasks, each with the first lines of its script's header, which is
# where every task is documented (what it runs, what to carry, its outputs).
#   scripts/device.sh list
#   scripts/device.sh tree_round "$OUT"        (carry .deps/debs and .corpus)
set -euo pipefail
tasks_dir=$(cd "$(dirname "$0")/device" && pwd)
tasks() { for f in "$tasks_dir"/*.sh; do t=${f##*/}; echo "${t%.sh}"; done; }
case "${1:-}" in
  "" | -h | --help)
    sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  list)
    for t in $(tasks); do
      echo "$t"
      sed -n '2,4p' "$tasks_dir/$t.sh" | sed 's/^#/   /'
    done
    exit 0
    ;;
esac
task=$1
shift
if [ ! -f "$tasks_dir/$task.sh" ]; then
  echo "scripts/device.sh: no task '$task'; the tasks are: $(tasks | tr '\n' ' ')(scripts/device.sh list says what each runs)" >&2
  exit 2
fi
exec bash "$tasks_dir/$task.sh" "$@"
