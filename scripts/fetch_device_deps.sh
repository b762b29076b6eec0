#!/usr/bin/env bash
# Downloads (does not install) the Debian packages the GPU machine lacks, into
# .deps/debs/, for scripts/device/build.sh. Run on the CPU machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.deps/debs"
cd "$root/.deps/debs"
apt-get download libboost-program-options1.74-dev libboost-program-options1.74.0 libboost1.74-dev
# ICU 72 for the tokenizers (core/text): the library and its headers (libicu-dev's other
# dependencies, icu-devtools and libc6-dev, are not needed to build against it).
apt-get download libicu72 libicu-dev
ls -la "$root/.deps/debs"
