#!/usr/bin/env bash
# What `--deterministic` costs `blend batch`, per model and checkpoint dtype (issue 25).
#
#   bench/deterministic_cost.sh            # tiny and smollm-135m, f32 and bf16 checkpoints
#
# For each model (PRESETS) and dtype (DTYPES) it generates the model once with `blend model init`
# (random weights) under MODELS_DIR, then runs the same `blend batch` work (N_REQ requests, each a
# distinct PP-token prompt given as token ids, TG generated tokens, ignore_eos, greedy) REPS times
# without and with --deterministic, alternating the two so that a neighbour's load falls on both,
# and prints the median run time of each (stats.json's wall_seconds: the batch, not the model
# load) and their ratio. The machine is named in the first line of the output.
# Knobs (environment): BLEND (default build/blend), MODELS_DIR (build/bench_models), OUT_DIR
# (build/deterministic_cost), PRESETS ("tiny smollm-135m"), DTYPES ("f32 bf16"), N_REQ (8), PP
# (32), TG (32), REPS (3), THREADS (0: all cores), BLEND_BATCH_ARGS (extra flags for blend batch).
# Only bash and python3 (standard library) are used; bench/lib.sh has the shared parts.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BLEND=${BLEND:-$ROOT/build/blend}
MODELS_DIR=${MODELS_DIR:-$ROOT/build/bench_models}
OUT_DIR=${OUT_DIR:-$ROOT/build/deterministic_cost}
PRESETS=${PRESETS:-"tiny smollm-135m"}
DTYPES=${DTYPES:-"f32 bf16"}
N_REQ=${N_REQ:-8}
PP=${PP:-32}
TG=${TG:-32}
REPS=${REPS:-3}
THREADS=${THREADS:-0}
need_blend_and_python
check_reps
mkdir -p "$OUT_DIR" "$MODELS_DIR"

echo "== machine: $(cpu_model), $(nproc) cores," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg); N_REQ=$N_REQ PP=$PP TG=$TG REPS=$REPS"

req=$OUT_DIR/requests.jsonl
write_requests "$req" "$N_REQ" "$PP" "$TG"

read -r -a extra <<<"${BLEND_BATCH_ARGS:-}"
# run MODEL_DIR TAG FLAGS...: one blend batch run; prints its wall_seconds.
run() {
  local model=$1 tag=$2
  shift 2
  run_batch "$model" "$tag" wall_seconds --threads "$THREADS" "${extra[@]}" "$@"
}

printf '%-12s %-5s %12s %12s %8s\n' model dtype "default s" "determ. s" ratio
for preset in $PRESETS; do
  for dtype in $DTYPES; do
    model=$MODELS_DIR/$preset-$dtype
    if [[ ! -f "$model/config.json" ]]; then
      "$BLEND" model init --preset "$preset" --dtype "$dtype" --out "$model" >/dev/null ||
        die "blend model init --preset $preset --dtype $dtype failed"
    fi
    plain=() determ=()
    for ((i = 0; i < REPS; i++)); do
      plain+=("$(run "$model" "$preset-$dtype-default")")
      determ+=("$(run "$model" "$preset-$dtype-deterministic" --deterministic)")
    done
    python3 - "$preset" "$dtype" "${plain[*]}" "${determ[*]}" <<'EOF'
import statistics, sys
preset, dtype = sys.argv[1], sys.argv[2]
a = [float(v) for v in sys.argv[3].split()]
b = [float(v) for v in sys.argv[4].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"{preset:<12} {dtype:<5} {ma:12.3f} {mb:12.3f} {mb / ma:8.2f}   "
      f"(runs: {' '.join(f'{v:.3f}' for v in a)} / {' '.join(f'{v:.3f}' for v in b)})")
EOF
  done
done
