#!/usr/bin/env bash
# Build dflash-host on the GPU machine against the torch wheel's LibTorch
# (CUDA) and run the test suite there. One command for any device run:
#   scripts/device/build.sh [extra ctest args]
# Needs .deps/debs/ (Boost.Program_options 1.74 and ICU 72 .debs, which that
# machine lacks): run scripts/fetch_device_deps.sh here first and carry .deps/debs.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
deps="$root/.deps"
build="${DFLASH_DEVICE_BUILD_DIR:-$root/build-gpu}"

if [ ! -d "$deps/boost-po/usr/include/boost" ]; then
  ls "$deps"/debs/libboost*.deb >/dev/null 2>&1 || { echo "missing $deps/debs: run scripts/fetch_device_deps.sh and carry .deps/debs" >&2; exit 2; }
  for deb in "$deps"/debs/libboost*.deb; do dpkg -x "$deb" "$deps/boost-po"; done
fi
# ICU 72 (Debian's, as on the CPU machine) in its own folder, apart from Boost.
if [ ! -f "$deps/icu/usr/include/unicode/regex.h" ]; then
  ls "$deps"/debs/libicu*.deb >/dev/null 2>&1 || { echo "missing the ICU .debs in $deps/debs: run scripts/fetch_device_deps.sh and carry .deps/debs" >&2; exit 2; }
  for deb in "$deps"/debs/libicu*.deb; do dpkg -x "$deb" "$deps/icu"; done
fi
torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
# Boost comes only from the unpacked 1.74 (program_options and its headers),
# never mixed with the machine's 1.83 headers. ICU from the unpacked 72: its
# prefix in CMAKE_PREFIX_PATH (FindICU's ICU_ROOT alone finds the headers but
# not lib/x86_64-linux-gnu), and an RPATH (not RUNPATH: --disable-new-dtags),
# which the loader also uses for libicuuc's own libicudata.so.72.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/icu/usr" \
  -DBoost_DIR="$deps/boost-po/usr/lib/x86_64-linux-gnu/cmake/Boost-1.74.0" \
  -Dboost_headers_DIR="$deps/boost-po/usr/lib/x86_64-linux-gnu/cmake/boost_headers-1.74.0" \
  -Dboost_program_options_DIR="$deps/boost-po/usr/lib/x86_64-linux-gnu/cmake/boost_program_options-1.74.0" \
  -DBoost_NO_SYSTEM_PATHS=ON \
  -DICU_ROOT="$deps/icu/usr" \
  -DCMAKE_INSTALL_RPATH="$deps/boost-po/usr/lib/x86_64-linux-gnu;$deps/icu/usr/lib/x86_64-linux-gnu" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags" \
  -DDFLASH_BUILD_TESTS="$([ "${DFLASH_DEVICE_NO_TESTS:-0}" = "1" ] && echo OFF || echo ON)" \
  ${DFLASH_CUDA_ARCHITECTURES:+-DCMAKE_CUDA_ARCHITECTURES=$DFLASH_CUDA_ARCHITECTURES}
# DFLASH_CUDA_ARCHITECTURES=90a: Hopper's own code (the invariant linear's
# warpgroup-MMA products, which it then runs); the default is the GPU's own.
# DFLASH_DEVICE_TARGETS="dflash-host drafter_bench drafter_tests": only these
# targets (and what they depend on), for a short device call.
# shellcheck disable=SC2086
cmake --build "$build" -j "$(nproc)" ${DFLASH_DEVICE_TARGETS:+--target $DFLASH_DEVICE_TARGETS}
"$build/bin/dflash-host" --version
# DFLASH_DEVICE_SKIP_TESTS=1: build only (scripts/device/decode_check.sh runs
# a selection itself). DFLASH_DEVICE_NO_TESTS=1: the host, the plugins and the
# benchmarks only, no test programs (scripts/gpu_demo.sh: the tests are most
# of the build).
[ "${DFLASH_DEVICE_SKIP_TESTS:-0}" = "1" ] || [ "${DFLASH_DEVICE_NO_TESTS:-0}" = "1" ] || ctest --test-dir "$build" -j 8 --output-on-failure "$@"
