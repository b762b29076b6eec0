#!/usr/bin/env bash
# The SDK as a third party meets it: install dflash-host, build the example
# loss plugin out of tree against the installed SDK only (no host sources, no
# host rebuild), then load it with the installed host.
#   out_of_tree_test.sh <host build dir> <host source dir>
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
host="$work/prefix/bin/dflash-host"
host_mtime=$(stat -c %Y "$host")

# The LibTorch the host was built against (a plugin must use the same one).
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")
example="$work/prefix/share/dflash-host/sdk-examples/weighted_ce_loss"
cmake -S "$example" -B "$work/plugin" -DCMAKE_PREFIX_PATH="$work/prefix" -DTorch_DIR="$torch_dir" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
cmake --build "$work/plugin" -j2 >/dev/null

# It compiled against the installed headers, never the host's source tree.
if grep -q "$src/" "$work/plugin/compile_commands.json"; then
  echo "FAIL: the out-of-tree build referenced the host source tree" >&2
  exit 1
fi
grep -q "$work/prefix/include" "$work/plugin/compile_commands.json" || {
  echo "FAIL: the out-of-tree build did not use the installed SDK headers" >&2
  exit 1
}

listing=$("$host" list --plugin-dir "$work/plugin")
echo "$listing"
grep -q "example_weighted_ce" <<<"$listing" || { echo "FAIL: example plugin not listed" >&2; exit 1; }
# The installed in-tree plugins are found beside the installed host, without flags.
grep -q "constant" <<<"$listing" || { echo "FAIL: installed plugins not found by default" >&2; exit 1; }

described=$("$host" describe example_weighted_ce --plugin-dir "$work/plugin")
grep -q "temperature" <<<"$described" || { echo "FAIL: describe lacks the config" >&2; exit 1; }

config=$("$host" config --plugin-dir "$work/plugin" --loss example_weighted_ce --set loss.temperature=2)
grep -q '"temperature": 2' <<<"$config" || { echo "FAIL: config override not applied: $config" >&2; exit 1; }

[ "$(stat -c %Y "$host")" = "$host_mtime" ] || { echo "FAIL: the host was rebuilt" >&2; exit 1; }
echo "PASS: out-of-tree plugin built against the installed SDK and loaded by the installed host"
