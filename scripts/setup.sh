#!/usr/bin/env bash
# One command from a fresh clone: installs the Debian packages dflash-host
# needs (Debian 12), then configures and builds into build/.
#   scripts/setup.sh            # packages + build
#   DFLASH_SKIP_APT=1 scripts/setup.sh   # build only
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${DFLASH_BUILD_DIR:-$root/build}"
jobs="${DFLASH_JOBS:-2}"

packages=(
  g++ cmake ninja-build git
  libtorch-dev libopenblas0-pthread libgloo-dev   # LibTorch 1.13 (CPU), a fast BLAS, c10d headers
  libboost-dev libboost-program-options-dev       # Boost.DLL (header-only), Boost.Program_options
  nlohmann-json3-dev libspdlog-dev libfmt-dev
  libicu-dev                                      # ICU: the tokenizers' Unicode (regex classes, NFC)
  libgtest-dev libgmock-dev libbenchmark-dev
)

if [ "${DFLASH_SKIP_APT:-0}" != "1" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${packages[@]}"
fi

# Release: no debug info. With -g a translation unit that includes LibTorch
# compiled 1.7× slower (dflash_model.cpp: 20.7 s against 12.4 s on one
# core), and CI builds everything on two. DFLASH_BUILD_TYPE=RelWithDebInfo
# gives a build to debug.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${DFLASH_BUILD_TYPE:-Release}"
cmake --build "$build" -j "$jobs"
echo "built: $build/bin/dflash-host (plugins in $build/lib/dflash-host/plugins)"
