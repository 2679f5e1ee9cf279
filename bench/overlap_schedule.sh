#!/usr/bin/env bash
# What overlapped scheduling (`--overlap-schedule on`: step i+1 planned while step i computes,
# NanoFlow §5.3) gains `blend batch` on the cpu backend (issue 24).
#
#   bench/overlap_schedule.sh      # smollm-135m bf16, 256 requests of 128 + 128 tokens
#
# Generates the model once with `blend model init` (random weights) under MODELS_DIR, then runs
# the same `blend batch` work (N_REQ distinct PP-token prompts as token ids, TG generated tokens,
# ignore_eos, greedy) REPS times with overlap off and on, alternating so that a neighbour's load
# falls on both. Prints per run the batch's tokens/s and the seconds the engine's thread spent
# outside the backend's compute (step_seconds - backend_seconds: planning, detokenizing, results),
# then the medians and their ratio.
# Knobs (environment): BLEND (build/blend), MODELS_DIR (build/bench_models), OUT_DIR
# (build/overlap_schedule), PRESET (smollm-135m), DTYPE (bf16), N_REQ (256), PP (128), TG (128),
# REPS (3), THREADS (0: all cores), BLEND_BATCH_ARGS (extra flags for blend batch).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BLEND=${BLEND:-$ROOT/build/blend}
MODELS_DIR=${MODELS_DIR:-$ROOT/build/bench_models}
OUT_DIR=${OUT_DIR:-$ROOT/build/overlap_schedule}
PRESET=${PRESET:-smollm-135m}
DTYPE=${DTYPE:-bf16}
N_REQ=${N_REQ:-256}
PP=${PP:-128}
TG=${TG:-128}
REPS=${REPS:-3}
THREADS=${THREADS:-0}
need_blend_and_python
check_reps
mkdir -p "$OUT_DIR" "$MODELS_DIR"
model=$MODELS_DIR/$PRESET-$DTYPE
if [[ ! -f "$model/config.json" ]]; then
  "$BLEND" model init --preset "$PRESET" --dtype "$DTYPE" --out "$model" >/dev/null ||
    die "blend model init --preset $PRESET --dtype $DTYPE failed"
fi

echo "== machine: $(cpu_model), $(nproc) cores," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg); $PRESET $DTYPE N_REQ=$N_REQ PP=$PP TG=$TG"
req=$OUT_DIR/requests.jsonl
write_requests "$req" "$N_REQ" "$PP" "$TG"

read -r -a extra <<<"${BLEND_BATCH_ARGS:-}"
for ((i = 0; i < REPS; i++)); do
  for overlap in off on; do
    run_batch "$model" "$overlap-$i" throughput_tokens_per_s --threads "$THREADS" \
      --overlap-schedule "$overlap" "${extra[@]}" >/dev/null
  done
done

python3 - "$OUT_DIR" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
med = {}
for overlap in ("off", "on"):
    tps, host = [], []
    for i in range(reps):
        s = json.load(open(f"{out}/stats-{overlap}-{i}.json"))
        tps.append(s["throughput_tokens_per_s"])
        host.append(s["step_seconds"] - s["backend_seconds"])
    med[overlap] = statistics.median(tps)
    print(f"overlap {overlap:<3}  tok/s {' '.join(f'{v:8.1f}' for v in tps)}  median {med[overlap]:8.1f}"
          f"   host s {' '.join(f'{v:6.2f}' for v in host)}")
print(f"on / off: {med['on'] / med['off']:.3f}")
PY
