#!/usr/bin/env bash
# The SDK as a third party meets it: install dflash-host, build the example
# loss plugins out of tree against the installed SDK only (no host sources, no
# host rebuild), then load them with the installed host.
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
examples="$work/prefix/share/dflash-host/sdk-examples"
# Each example is its own project, as a researcher's loss would be; a loss on
# the chunked-loss toolkit stays under 60 lines of C++ (its test/ beside it
# not counted).
declare -A plugin_of=([weighted_ce_loss]=example_weighted_ce [reverse_kl_loss]=example_reverse_kl [jsd_loss]=example_jsd)
for example in weighted_ce_loss reverse_kl_loss jsd_loss; do
  lines=$(cat "$examples/$example"/*.cpp | wc -l)
  [ "$lines" -lt 60 ] || { echo "FAIL: $example has $lines lines of C++ (the toolkit's promise is under 60)" >&2; exit 1; }
  cmake -S "$examples/$example" -B "$work/plugins/$example" -DCMAKE_PREFIX_PATH="$work/prefix" -DTorch_DIR="$torch_dir" \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
  cmake --build "$work/plugins/$example" -j2 >/dev/null
  # Its own test, on the SDK's loss test kit: values, gradients and memory, no host.
  ctest --test-dir "$work/plugins/$example" --output-on-failure >"$work/ctest.log" 2>&1 || {
    cat "$work/ctest.log" >&2
    echo "FAIL: $example's own test (the SDK's loss test kit) failed" >&2
    exit 1
  }
  # It compiled against the installed headers, never the host's source tree.
  if grep -q "$src/" "$work/plugins/$example/compile_commands.json"; then
    echo "FAIL: the out-of-tree build of $example referenced the host source tree" >&2
    exit 1
  fi
  grep -q "$work/prefix/include" "$work/plugins/$example/compile_commands.json" || {
    echo "FAIL: the out-of-tree build of $example did not use the installed SDK headers" >&2
    exit 1
  }
  listing=$("$host" list --plugin-dir "$work/plugins/$example")
  echo "$listing"
  grep -q "${plugin_of[$example]}" <<<"$listing" || { echo "FAIL: ${plugin_of[$example]} not listed" >&2; exit 1; }
  # The installed in-tree plugins are found beside the installed host, without flags.
  grep -q "constant" <<<"$listing" || { echo "FAIL: installed plugins not found by default" >&2; exit 1; }
done

described=$("$host" describe example_weighted_ce --plugin-dir "$work/plugins/weighted_ce_loss")
grep -q "temperature" <<<"$described" || { echo "FAIL: describe lacks the config" >&2; exit 1; }
grep -q "chunk_size" <<<"$described" || { echo "FAIL: describe lacks the toolkit's chunk_size" >&2; exit 1; }

config=$("$host" config --plugin-dir "$work/plugins/weighted_ce_loss" --loss example_weighted_ce --set loss.temperature=2)
grep -q '"temperature": 2' <<<"$config" || { echo "FAIL: config override not applied: $config" >&2; exit 1; }

# The planner asks the out-of-tree loss for its memory, as it asks the in-tree ones.
planned=$(cd "$src" && "$host" plan --config configs/quickstart.json --plugin-dir "$work/plugins/reverse_kl_loss" \
  --loss example_reverse_kl)
grep -q "loss: working memory at its peak .* loss example_reverse_kl" <<<"$planned" || {
  echo "FAIL: the plan has no working memory from example_reverse_kl: $planned" >&2
  exit 1
}

[ "$(stat -c %Y "$host")" = "$host_mtime" ] || { echo "FAIL: the host was rebuilt" >&2; exit 1; }
echo "PASS: out-of-tree plugins built against the installed SDK and loaded by the installed host"
