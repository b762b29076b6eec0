#!/usr/bin/env bash
# Copies the part of SpecForge's source that its LlamaForCausalLMEagle3 needs
# into .ref/eagle3/specforge/ (ignored by git; carry .ref to the GPU machine),
# for scripts/check_reference_eagle3.py (its model) and
# scripts/peer_eagle3_step.py (its trainer's step: OnlineEagle3Model, BF16Optimizer). SpecForge is pure Python; nothing is
# built or installed.
#   scripts/fetch_reference_eagle3.sh GIT_DIR [COMMIT]   (a clone or bare mirror of sgl-project/SpecForge)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
git_dir=${1:?usage: scripts/fetch_reference_eagle3.sh GIT_DIR [COMMIT]}
commit=${2:-HEAD}
dest="$root/.ref/eagle3"
rm -rf "$dest"
mkdir -p "$dest"
files="specforge/__init__.py specforge/distributed.py specforge/utils.py specforge/modeling/__init__.py
specforge/modeling/_mask_utils.py specforge/modeling/draft/__init__.py specforge/modeling/draft/base.py
specforge/modeling/draft/registry.py specforge/modeling/draft/flex_attention.py specforge/modeling/draft/llama3_eagle.py
specforge/optimizer.py specforge/lr_scheduler.py specforge/core/__init__.py specforge/core/compact_teacher.py
specforge/core/eagle3_adapters.py specforge/core/lk_loss.py specforge/core/loss.py specforge/algorithms/eagle3/model.py"
for f in $files; do
  mkdir -p "$dest/$(dirname "$f")"
  git --git-dir="$git_dir" show "$commit:$f" > "$dest/$f"
done
git --git-dir="$git_dir" rev-parse "$commit" > "$dest/COMMIT"
echo "SpecForge $(cat "$dest/COMMIT") -> $dest"
