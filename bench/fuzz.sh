#!/usr/bin/env bash
# Runs every libFuzzer harness of tests/fuzz for SECONDS each (issue 26) and prints one row per
# harness: runs, executions per second, coverage, corpus size, peak RSS, and "ok" or what it
# found. Exits non-zero when any harness finds a crash, a leak, a timeout or an out-of-memory.
#
#   bench/fuzz.sh SECONDS [HARNESS...]     e.g. bench/fuzz.sh 600, bench/fuzz.sh 60 jinja bpe
#
# Builds the harnesses with clang in build-fuzz/ (-fsanitize=fuzzer,address,undefined; only the
# sources each one exercises). Each harness starts from its committed seed corpus
# (tests/fuzz/corpus/NAME, the Jinja one also from the chat templates in tests/text/data) and
# writes what it discovers to a scratch directory, never into the tree. Findings are kept in
# $FUZZ_OUT (default build-fuzz/findings/NAME) for reproduction:
#   build-fuzz/tests/fuzz/blend_fuzz_NAME build-fuzz/findings/NAME/crash-...
# Harnesses run $FUZZ_JOBS at a time (default: the number of cores). CI runs `bench/fuzz.sh 60`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

seconds=${1:-}
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || die "usage: bench/fuzz.sh SECONDS [HARNESS...]"
shift
all=(safetensors config gguf tokenizer_json bpe jinja openai_request batch_lines http_request http_framing json_schema)
harnesses=("$@")
((${#harnesses[@]})) || harnesses=("${all[@]}")
for h in "${harnesses[@]}"; do
  [[ " ${all[*]} " == *" $h "* ]] || die "unknown harness '$h' (one of: ${all[*]})"
done
command -v clang++ >/dev/null || die "clang++ is required (scripts/setup.sh installs it)"

build="$ROOT/build-fuzz"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1 with line tables, as libFuzzer's own examples build: the harnesses' sources compile in about
# two thirds of the time of -O2 -g, which is most of a CI smoke run's cost.
opt="-O1 -gline-tables-only -DNDEBUG"
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$opt" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$opt" \
  -DBLEND_FUZZ=ON -DBLEND_WERROR=OFF -DBLEND_BUILD_TESTS=OFF -DBLEND_BUILD_BENCH=OFF \
  "${launcher[@]}" >/dev/null
# Quiet when the build succeeds; a failed build prints its errors (CI shows nothing else).
if ! build_log=$(cmake --build "$build" --target fuzz -j "$(nproc)" 2>&1); then
  printf '%s\n' "$build_log" | grep -E 'error|FAILED|undefined reference' | head -40 >&2
  die "building the fuzz harnesses failed (full log: cmake --build $build --target fuzz)"
fi

dict_for() {
  case "$1" in
    openai_request | batch_lines | json_schema) echo "-dict=$ROOT/tests/fuzz/json.dict" ;;
    jinja) echo "-dict=$ROOT/tests/fuzz/jinja.dict" ;;
  esac
}
seeds_for() {
  echo "$ROOT/tests/fuzz/corpus/$1"
  [ "$1" = jinja ] && echo "$ROOT/tests/text/data/chat_templates"
  return 0
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
out_root=${FUZZ_OUT:-$build/findings}

run_one() {
  local h=$1 work="$scratch/$1"
  mkdir -p "$work/corpus" "$out_root/$h"
  local seeds
  mapfile -t seeds < <(seeds_for "$h")
  # -timeout: one input may take at most 10 s (a hang is a finding); -rss_limit_mb: the Jinja
  # engine alone may build 256 MiB lists and 64 MiB strings, so 2 GiB is an allocation bug.
  # The scratch corpus comes first: libFuzzer writes new inputs only to the first directory.
  local rc=0
  (cd "$out_root/$h" && "$build/tests/fuzz/blend_fuzz_$h" -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 $(dict_for "$h") \
    "$work/corpus" "${seeds[@]}") >"$work/log" 2>&1 || rc=$?
  cp "$work/log" "$out_root/$h/last.log"
  echo "$rc" >"$work/rc"
}

export -f run_one dict_for seeds_for
export build scratch out_root seconds ROOT
jobs=${FUZZ_JOBS:-$(nproc)}
printf '%s\n' "${harnesses[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}'

printf '%-16s %10s %8s %6s %7s %8s  %s\n' harness runs exec/s cov corpus rss_mb result
failed=0
for h in "${harnesses[@]}"; do
  log="$scratch/$h/log"
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)  # none: it died early
  corpus=$(find "$scratch/$h/corpus" -type f | wc -l)
  result=ok
  if [ "$(cat "$scratch/$h/rc")" != 0 ]; then
    failed=1
    result="FOUND: $(grep -m1 -oE 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)[^(]*' "$log" || echo "exit $(cat "$scratch/$h/rc")") (see $out_root/$h)"
  fi
  printf '%-16s %10s %8s %6s %7s %8s  %s\n' "$h" "$(stat number_of_executed_units)" \
    "$(stat average_exec_per_sec)" "${cov:-?}" "$corpus" "$(stat peak_rss_mb)" "$result"
done
echo "$(cpu_model), $(nproc) cores, ${seconds} s per harness, $(date -u +%Y-%m-%d)"
exit "$failed"
