#!/usr/bin/env bash
# Puts a copy of z-lab's reference DFlash model code — dflash/model.py of the
# public repository github.com/z-lab/dflash, the transformers-based
# DFlashDraftModel users serve drafters with — into .ref/dflash/, for
# scripts/check_reference_drafter.py on the GPU machine (which has no network).
#
# The code is theirs: .ref/ is ignored by git and must never be committed.
# Carry it to the device run instead (carry: [".ref"]).
#
#   scripts/fetch_reference_dflash.sh GIT_DIR [REVISION]
#
# GIT_DIR is a local clone or bare git directory of z-lab/dflash (for example
# the mirror an agent's `fetch github:z-lab/dflash` leaves); REVISION defaults
# to HEAD. Writes .ref/dflash/model.py and .ref/dflash/SOURCE (commit, date,
# file hash), and prints both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
git_dir=$1
revision=${2:-HEAD}
if ! git --git-dir="$git_dir" rev-parse --verify --quiet "$revision^{commit}" >/dev/null; then
  # A work tree's .git is also accepted.
  if [ -d "$git_dir/.git" ]; then git_dir="$git_dir/.git"; fi
fi
commit=$(git --git-dir="$git_dir" rev-parse --verify "$revision^{commit}" 2>/dev/null) || {
  echo "error: $git_dir is not a git directory with revision '$revision' (give a clone or bare copy of z-lab/dflash)" >&2
  exit 2
}
if ! git --git-dir="$git_dir" cat-file -e "$commit:dflash/model.py" 2>/dev/null; then
  echo "error: $git_dir at $commit has no dflash/model.py; is it z-lab/dflash?" >&2
  exit 2
fi
if ! git --git-dir="$git_dir" show "$commit:dflash/model.py" | grep -q "class DFlashDraftModel"; then
  echo "error: $git_dir:$commit:dflash/model.py defines no DFlashDraftModel; is it z-lab/dflash?" >&2
  exit 2
fi
out="$root/.ref/dflash"
mkdir -p "$out"
git --git-dir="$git_dir" show "$commit:dflash/model.py" > "$out/model.py"
{
  echo "repository: github.com/z-lab/dflash (copied from $git_dir)"
  echo "commit: $commit"
  echo "commit date: $(git --git-dir="$git_dir" show -s --format=%cI "$commit")"
  echo "file: dflash/model.py, sha256 $(sha256sum "$out/model.py" | cut -d' ' -f1)"
  echo "copied: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$out/SOURCE"
if git -C "$root" check-ignore -q "$out/model.py"; then
  cat "$out/SOURCE"
  echo "wrote $out/model.py (ignored by git; carry .ref to the device run)"
else
  echo "error: $out is not ignored by git; add /.ref/ to .gitignore before going on (the reference code must not be committed)" >&2
  exit 1
fi
