#!/usr/bin/env bash
# `blend batch` throughput with a CPU hog on one core against without, per OpenMP wait policy
# (issue 25: idle OpenMP threads that spin starve the thread with the work when another process
# wants a core).
#
#   bench/contention.sh
#
# For each model (MODELS: preset-dtype, generated once with `blend model init` under MODELS_DIR)
# and each variant (VARIANTS: name=ENV,ENV... or name= for none) it runs the same `blend batch`
# work (N_REQ requests, distinct PP-token prompts as token ids, TG generated tokens, ignore_eos,
# greedy) REPS times on a quiet machine and REPS times beside a busy loop pinned to core 0
# (taskset), all interleaved so that a neighbour's load falls on every cell alike, and prints the
# median throughput (stats.json's throughput_tokens_per_s) of each and their ratio. The default
# variants: "before" = libgomp's default spin (GOMP_SPINCOUNT=300000, OpenBLAS's own pool: what
# blend ran before issue 25), "after" = no environment (blend's own choice), "passive" =
# OMP_WAIT_POLICY=passive.
# A variant's comma-separated words that start with -- are `blend batch` flags instead, e.g.
# VARIANTS="auto= two=--threads=2 one=--threads=1" compares blend's own thread count (CoreShare:
# the cores other processes leave free) with fixed ones.
# CONDITIONS ("quiet hog") are the columns; "quota" runs each blend inside the cgroup directory
# QUOTA_CGROUP (v1 or v2, made beforehand with a CPU quota, e.g. as root: mkdir
# /sys/fs/cgroup/cpu/q && echo 100000 > /sys/fs/cgroup/cpu/q/cpu.cfs_quota_us: one core), as a
# container started with --cpus would.
# Knobs (environment): BLEND (default build/blend), MODELS_DIR (build/bench_models), OUT_DIR
# (build/contention), MODELS ("tiny-f32 smollm-135m-bf16"), VARIANTS, N_REQ (4), PP (32), TG (32),
# REPS (3), HOG_CPU (0), CONDITIONS, QUOTA_CGROUP.
# Only bash, taskset and python3 (standard library) are used; bench/lib.sh has the shared parts.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BLEND=${BLEND:-$ROOT/build/blend}
MODELS_DIR=${MODELS_DIR:-$ROOT/build/bench_models}
OUT_DIR=${OUT_DIR:-$ROOT/build/contention}
MODELS=${MODELS:-"tiny-f32 smollm-135m-bf16"}
NPROC=$(nproc)
VARIANTS=${VARIANTS:-"before=GOMP_SPINCOUNT=300000,OPENBLAS_NUM_THREADS=$NPROC after= passive=OMP_WAIT_POLICY=passive"}
N_REQ=${N_REQ:-4}
PP=${PP:-32}
TG=${TG:-32}
REPS=${REPS:-3}
HOG_CPU=${HOG_CPU:-0}
CONDITIONS=${CONDITIONS:-"quiet hog"}
QUOTA_CGROUP=${QUOTA_CGROUP:-}
if [[ " $CONDITIONS " == *" quota "* ]]; then
  [[ -w $QUOTA_CGROUP/cgroup.procs ]] ||
    die "CONDITIONS has quota: set QUOTA_CGROUP to a cgroup directory whose cgroup.procs you may write"
fi
need_blend_and_python
command -v taskset >/dev/null || die "taskset is required (util-linux)"
check_reps
mkdir -p "$OUT_DIR" "$MODELS_DIR"

HOG_PID=""
stop_hog() {
  if [[ -n "$HOG_PID" ]]; then
    kill "$HOG_PID" 2>/dev/null || true
    wait "$HOG_PID" 2>/dev/null || true
    HOG_PID=""
  fi
}
trap stop_hog EXIT
start_hog() {
  taskset -c "$HOG_CPU" bash -c 'while :; do :; done' &
  HOG_PID=$!
}

echo "== machine: $(cpu_model), $NPROC cores," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg); N_REQ=$N_REQ PP=$PP TG=$TG REPS=$REPS," \
  "hog: a busy loop on cpu $HOG_CPU; conditions: $CONDITIONS${QUOTA_CGROUP:+ (quota: $QUOTA_CGROUP)}"

req=$OUT_DIR/requests.jsonl
write_requests "$req" "$N_REQ" "$PP" "$TG"

# run MODEL_DIR TAG WORDS: one blend batch run under WORDS (comma-separated NAME=VALUE environment
# settings and --flag=value flags); prints its throughput.
run() {
  local model=$1 tag=$2 words=$3
  local -a BATCH_ENV=() flags=() all=()
  if [[ -n "$words" ]]; then IFS=',' read -r -a all <<<"$words"; fi
  for w in "${all[@]}"; do
    if [[ $w == --* ]]; then flags+=("$w"); else BATCH_ENV+=("$w"); fi
  done
  run_batch "$model" "$tag" throughput_tokens_per_s ${flags[@]+"${flags[@]}"}
}

results=$OUT_DIR/results.txt
: >"$results"
for m in $MODELS; do
  model=$MODELS_DIR/$m
  if [[ ! -f "$model/config.json" ]]; then
    "$BLEND" model init --preset "${m%-*}" --dtype "${m##*-}" --out "$model" >/dev/null ||
      die "blend model init --preset ${m%-*} --dtype ${m##*-} failed"
  fi
  for ((i = 0; i < REPS; i++)); do
    for cond in $CONDITIONS; do
      BATCH_PREFIX=()
      [[ $cond == hog ]] && start_hog
      # shellcheck disable=SC2016  # $$ and $@ belong to the inner shell
      [[ $cond == quota ]] && BATCH_PREFIX=(bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$QUOTA_CGROUP")
      for v in $VARIANTS; do
        name=${v%%=*}
        echo "$m $name $cond $(run "$model" "$m-$name-$cond" "${v#*=}")" >>"$results"
      done
      stop_hog
    done
  done
done

python3 - "$results" $CONDITIONS <<'EOF'
import collections, statistics, sys
conds = sys.argv[2:]
cells = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    m, v, cond, tps = line.split()
    cells[(m, v, cond)].append(float(tps))
    if (m, v) not in order:
        order.append((m, v))
head = "".join(f" {c + ' tok/s':>12}" for c in conds)
head += "".join(f" {c + '/' + conds[0]:>12}" for c in conds[1:])
print(f"{'model':<18} {'variant':<8}{head}   runs")
for m, v in order:
    med = [statistics.median(cells[(m, v, c)]) for c in conds]
    row = "".join(f" {x:12.1f}" for x in med) + "".join(f" {x / med[0]:12.2f}" for x in med[1:])
    runs = " / ".join(" ".join(f"{x:.0f}" for x in cells[(m, v, c)]) for c in conds)
    print(f"{m:<18} {v:<8}{row}   ({runs})")
EOF
