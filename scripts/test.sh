#!/usr/bin/env bash
# Builds blend and runs the whole test suite with CTest.
#   scripts/test.sh             Release build in build/
#   scripts/test.sh --sanitize  the same tests under -fsanitize=address,undefined in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
flags=(-DCMAKE_BUILD_TYPE=Release)
if [ "${1:-}" = "--sanitize" ]; then
  build=build-asan
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DBLEND_SANITIZE=ON -DBLEND_BUILD_BENCH=OFF)
fi
jobs=$(nproc)
cmake -S . -B "$build" -G Ninja "${flags[@]}" >/dev/null
cmake --build "$build" -j "$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
