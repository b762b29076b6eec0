#!/usr/bin/env bash
# The whole test suite, as the README and CI run it: ctest over the build,
# then why each skipped test did not run (a test needing CUDA, the real
# tokenizer files, Chromium or Jinja2 skips on a machine without them, and
# says so; ctest alone prints only "(Skipped)").
#   scripts/test.sh [ctest arguments...]      # DFLASH_BUILD_DIR, DFLASH_JOBS as setup.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${DFLASH_BUILD_DIR:-$root/build}"
# OpenBLAS (under Debian's LibTorch) picks its kernels by the CPU's model; on
# VMs that hide it, it runs its SSE3 (Prescott) kernels, several times slower.
# dflash-host warns about it (core/runtime/cpu_blas.h); here the tests'
# processes get the core this CPU supports, as the warning would say.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
  has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
  if has avx512f avx512cd avx512bw avx512dq avx512vl avx2 fma; then export OPENBLAS_CORETYPE=SkylakeX
  elif has avx2 fma; then export OPENBLAS_CORETYPE=Haswell; fi
fi
ctest --test-dir "$build" -j "${DFLASH_JOBS:-2}" --output-on-failure "$@"
status=$?
log="$build/Testing/Temporary/LastTest.log"
# GoogleTest writes "file:line: Skipped", the reason, then "[  SKIPPED ] Name".
[ -f "$log" ] && awk '
  /^[0-9]+\/[0-9]+ Test: / { name = $3; next }
  /: Skipped$/ { reading = 1; reason = ""; next }
  reading && /^\[  SKIPPED \]/ {
    reading = 0
    if (reason == "") reason = "(no reason given)"
    if (!(reason in count)) order[++n] = reason
    count[reason]++
    names[reason] = names[reason] (count[reason] > 1 ? ", " : "") name
    next
  }
  reading { reason = reason (reason == "" ? "" : " ") $0 }
  END {
    if (n == 0) exit
    total = 0
    for (i = 1; i <= n; ++i) total += count[order[i]]
    printf "\n%d tests skipped, and why:\n", total
    for (i = 1; i <= n; ++i) printf "- %s\n  (%d: %s)\n", order[i], count[order[i]], names[order[i]]
  }' "$log"
exit $status
