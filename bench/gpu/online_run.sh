#!/usr/bin/env bash
# One run on the lent GPU machine for NanoFlow's online experiment (issue 29, Fig. 11/12) and
# its per-step resource use (Fig. 14): for each COMBOS combination (run_lib.sh's run_combo),
# bench/gpu/online.py serves the 8B folder with `blend serve --backend cuda --scheduler fcfs`,
# loads it with `blend bench serve` at each RATES rate (Poisson arrivals, ShareGPT-like lengths
# from data/traces, DURATION seconds each), then runs `blend batch --step-timings` on
# TIMELINE_WORK; --report writes $OUT/online.md (normalized latency against rate, the steps'
# compute and memory use against the peaks torch measures in the same run) and the latency CDF
# plots. From the repository root, with .gpu/ (bench/gpu/bundle.sh's archive) carried:
#   bash bench/gpu/online_run.sh
# Knobs: COMBOS (default "off/default/0 auto/default/0/profile"), RATES (4,8,16,32), DURATION
# (30), BUDGET (2048), TIMELINE_WORK (512:512:256), TOTAL (480 s), CUDA_TESTS (0 here: the
# tests run in the other scripts). The paper's traces run 5 minutes a rate; DURATION scales
# that down to fit a lent machine's minutes, and says so in the table.
# Without a GPU (a dry run of the whole script on the cpu backend, about 2 minutes here):
#   BLEND=build/blend BACKEND=cpu MODEL=build/bench_models/tiny-bf16 COMBOS=off/default/0 \
#     RATES=2,4 DURATION=5 TIMELINE_WORK=16:64:16 NO_TORCH=1 OUT=/tmp/online bash bench/gpu/online_run.sh
set -u
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/run_lib.sh"
run_start online_run
CUDA_TESTS="${CUDA_TESTS:-0}" run_cuda_tests
BACKEND="${BACKEND:-cuda}"
if [ -n "${MODEL:-}" ]; then model="$MODEL"; else make_8b_folder; fi
COMBOS="${COMBOS:-off/default/0 auto/default/0/profile}"
nano_profile_for "$COMBOS"
args=(--model "$model" --backend "$BACKEND" --rates "${RATES:-4,8,16,32}"
  --duration "${DURATION:-30}" --budget "${BUDGET:-2048}"
  --timeline-work "${TIMELINE_WORK:-512:512:256}" --traces "$here/../../data/traces")
[ "${NO_TORCH:-0}" = 1 ] && args+=(--no-torch)
for c in $COMBOS; do
  [ "$(left)" -lt 60 ] && { echo "online: skipping $c, $(left) s left"; continue; }
  step "online runs: $c"
  run_combo "$c" timeout -k 10 "$(($(left) - 20))" python3 "$here/online.py" "$BLEND" "$OUT" \
    --combo "$c" "${args[@]}"
done
step "report"
python3 "$here/online.py" "$BLEND" "$OUT" --report "${args[@]}"
rm -rf "$OUT"/serve-data-* "$OUT"/timeline-*/ "$OUT"/init
ls "$OUT"
