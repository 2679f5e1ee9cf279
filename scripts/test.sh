#!/usr/bin/env bash
# Builds blend and runs the whole test suite with CTest.
#   scripts/test.sh             Release build in build/
#   scripts/test.sh --sanitize  the same tests under -fsanitize=address,undefined in build-asan/
#                               (built with clang when it is installed)
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
flags=(-DCMAKE_BUILD_TYPE=Release)
if [ "${1:-}" = "--sanitize" ]; then
  build=build-asan
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DBLEND_SANITIZE=ON -DBLEND_BUILD_BENCH=OFF)
  # clang when installed (scripts/setup.sh installs it): it compiles the instrumented tree
  # about 2.5x faster than gcc (safetensors.cc: 19 s against 53 s), most of CI's time.
  # -O1 with line tables only: the sanitizers' own advice for speed, and CI's longest step is
  # compiling this tree; against -O2 -g it compiles model_cmd.cc in 18.1 s instead of 26.5 s and
  # stack traces still name file and line.
  if command -v clang++ >/dev/null; then
    opt="-O1 -gline-tables-only -DNDEBUG"
    flags+=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
      "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$opt" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$opt")
  fi
fi
jobs=$(nproc)
cmake -S . -B "$build" -G Ninja "${flags[@]}" >/dev/null
cmake --build "$build" -j "$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
