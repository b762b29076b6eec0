#!/usr/bin/env bash
# The loss plugins before and after the chunked-loss toolkit, in one device
# call: this tree's build (the loss tests run on the GPU), the loss plugins
# and loss_bench of commit 03ba08a (before the toolkit: ce, kl and topk_kl on
# full [N, V] logits), then both benches at both shapes, same machine, same
# call. The figures are in docs/performance.md ("Before and after the
# chunked-loss toolkit"). Here first:
#   mkdir -p scratch/old && git archive 03ba08a | tar -x -C scratch/old
# then on the device (carry .deps/debs and scratch/old):
#   timeout 590 scripts/device/loss_before_after.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/out}
mkdir -p "$out"
start=$(date +%s)
t() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$out/timeline.txt"; }
t "new build"
DFLASH_DEVICE_SKIP_TESTS=1 scripts/device/build.sh > "$out/build_new.txt" 2>&1 || { tail -50 "$out/build_new.txt"; exit 1; }
t "old build"
ln -sfn "$root/.deps" scratch/old/.deps
deps="$root/.deps"
torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S scratch/old -B build-old -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/icu/usr" \
  -DBoost_DIR="$deps/boost-po/usr/lib/x86_64-linux-gnu/cmake/Boost-1.74.0" \
  -Dboost_headers_DIR="$deps/boost-po/usr/lib/x86_64-linux-gnu/cmake/boost_headers-1.74.0" \
  -Dboost_program_options_DIR="$deps/boost-po/usr/lib/x86_64-linux-gnu/cmake/boost_program_options-1.74.0" \
  -DBoost_NO_SYSTEM_PATHS=ON -DICU_ROOT="$deps/icu/usr" \
  -DCMAKE_INSTALL_RPATH="$deps/boost-po/usr/lib/x86_64-linux-gnu;$deps/icu/usr/lib/x86_64-linux-gnu" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags" -DDFLASH_BUILD_TESTS=OFF > "$out/build_old.txt" 2>&1
cmake --build build-old -j 16 --target loss_bench dflash_loss_ce dflash_loss_kl dflash_loss_topk_kl dflash_loss_fused_ckpt_kl >> "$out/build_old.txt" 2>&1 || { tail -30 "$out/build_old.txt"; }
t "tests"
(cd build-gpu && ctest -j 8 --output-on-failure -R "CeLoss|KlLoss|TopKKl|FusedCkpt|AllLosses|ChunkedLoss|LossMemory" > "$out/tests.txt" 2>&1); tail -15 "$out/tests.txt"
build-gpu/bin/chunked_loss_tests --gtest_filter='*Narrow*' > "$out/chunked_cuda.txt" 2>&1; tail -3 "$out/chunked_cuda.txt"
new_dirs="--plugin-dir build-gpu/lib/dflash-host/plugins --plugin-dir build-gpu/test-plugins/sdk-examples"
old_dirs="--plugin-dir build-old/lib/dflash-host/plugins"
for shape in "--rows 4096 --hidden 4096 --vocab 128256" "--rows 32768 --hidden 5120 --vocab 248320"; do
  tag=$(echo $shape | awk '{print $2}')
  t "bench old $tag"
  build-old/bin/loss_bench $old_dirs $shape --json "$out/old_$tag.jsonl" 2>&1 | grep -v "info\]" | tee "$out/old_$tag.txt"
  t "bench new $tag"
  build-gpu/bin/loss_bench $new_dirs $shape --json "$out/new_$tag.jsonl" 2>&1 | grep -v "info\]" | tee "$out/new_$tag.txt"
done
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu.txt"
python3 -c 'import torch;print(torch.__version__, torch.version.cuda)' >> "$out/gpu.txt"
t "done"
