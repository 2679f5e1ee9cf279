#!/usr/bin/env bash
# Does the simulator predict this machine? Profiles the cpu backend, runs the same workload
# through `blend batch --policy P` for real (REPS times, median) and through
# `blend simulate --policy P@sequential`, and prints both throughputs, their ratio, and each
# policy's speedup over dfs measured vs simulated (issue 8: within 5% and 2 points).
#
#   bench/sim_validation.sh MODEL_DIR [WORKLOAD.jsonl]
#
# Two profiles are compared in the same run: "isolated" fits the cost model on single forward
# passes (`blend profile`); "steps" fits it on the steps of a real `blend batch` run of a
# separate calibration workload (`--step-timings`, then `blend profile --steps`), so the host's
# work between and around forward passes is in the fit while the workload validated is not.
#
# The workload must use token-id prompts with ignore_eos and max_tokens (the simulator's true
# output lengths). Without one, a mixed workload is generated: 96 requests, half compute-heavy
# (300-700 prompt tokens, 6-15 output), half memory-heavy (20-60 prompt, 120-260 output), on
# three shared prefixes of 64-160 tokens, shuffled (seed 7). The calibration workload is the
# same generator with seed 8 unless CALIBRATION names a file. Knobs: BLEND (build/blend),
# OUT_DIR (build/sim_validation), POLICIES ("dfs blend random"), REPS (5), THREADS (2),
# KV_GB (0.5), CALIBRATION_POLICY (dfs; one calibration run per rep).
set -euo pipefail
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 MODEL_DIR [WORKLOAD.jsonl]" >&2; exit 1; }
MODEL=$1
WORKLOAD=${2:-}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BLEND=${BLEND:-$ROOT/build/blend}
OUT_DIR=${OUT_DIR:-$ROOT/build/sim_validation}
POLICIES=${POLICIES:-"dfs blend random"}
REPS=${REPS:-5}
THREADS=${THREADS:-2}
KV_GB=${KV_GB:-0.5}
mkdir -p "$OUT_DIR"
generate() {  # generate SEED FILE
  python3 - "$1" "$2" <<'GEN'
import json, random, sys
rng = random.Random(int(sys.argv[1]))
prefixes = [[rng.randrange(100, 50000) for _ in range(n)] for n in (96, 160, 64)]
reqs = []
for i in range(96):
    heavy = i % 2 == 0
    p = prefixes[i % 3] + [rng.randrange(100, 50000)
                           for _ in range(rng.randrange(300, 700) if heavy else rng.randrange(20, 60))]
    out = rng.randrange(6, 16) if heavy else rng.randrange(120, 260)
    reqs.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                 "body": {"prompt": p, "max_tokens": out, "ignore_eos": True, "temperature": 0}})
rng.shuffle(reqs)
with open(sys.argv[2], "w") as f:
    for r in reqs:
        f.write(json.dumps(r) + "\n")
GEN
}
if [[ -z "$WORKLOAD" ]]; then
  WORKLOAD=$OUT_DIR/workload.jsonl
  generate 7 "$WORKLOAD"
fi
CALIBRATION=${CALIBRATION:-}
if [[ -z "$CALIBRATION" ]]; then
  CALIBRATION=$OUT_DIR/calibration.jsonl
  generate 8 "$CALIBRATION"
fi
CALIBRATION_POLICY=${CALIBRATION_POLICY:-dfs}

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), threads=$THREADS"
# The isolated fit; every run plans with it, as a user's run would.
"$BLEND" profile --model "$MODEL" --out "$OUT_DIR/profile-isolated.json" --threads "$THREADS" \
  --reps 5 | tail -1
# Calibration runs (step timings) interleaved with the runs validated, so both see the same
# machine: on this shared host a run's speed moves by 10-15% from minute to minute.
traces=()
for rep in $(seq 1 "$REPS"); do
  rm -f "$OUT_DIR/calibration-out.jsonl"
  "$BLEND" batch --model "$MODEL" --input "$CALIBRATION" --output "$OUT_DIR/calibration-out.jsonl" \
    --threads "$THREADS" --kv-memory "$KV_GB" --policy "$CALIBRATION_POLICY" \
    --hardware "$OUT_DIR/profile-isolated.json" --quiet \
    --step-timings "$OUT_DIR/calibration-steps-$rep.jsonl"
  traces+=("$OUT_DIR/calibration-steps-$rep.jsonl")
  for p in $POLICIES; do
    rm -f "$OUT_DIR/out-$p.jsonl"
    "$BLEND" batch --model "$MODEL" --input "$WORKLOAD" --output "$OUT_DIR/out-$p.jsonl" \
      --stats "$OUT_DIR/real-$p-$rep.json" --threads "$THREADS" --kv-memory "$KV_GB" \
      --policy "$p" --hardware "$OUT_DIR/profile-isolated.json" --quiet
  done
done
"$BLEND" profile --model "$MODEL" --out "$OUT_DIR/profile.json" --threads "$THREADS" --reps 5 \
  --steps "$(IFS=,; echo "${traces[*]}")" | tail -1
sim_list=$(for p in $POLICIES; do printf '%s@sequential,' "$p"; done)
for fit in isolated steps; do
  profile=$OUT_DIR/profile.json
  [[ $fit == isolated ]] && profile=$OUT_DIR/profile-isolated.json
  # Planned as the real runs were, with the isolated profile; timed by the fit.
  "$BLEND" simulate --json --model "$MODEL" --hardware "$profile" --workload "$WORKLOAD" \
    --planner-hardware "$OUT_DIR/profile-isolated.json" \
    --policy "${sim_list%,}" --kv-memory "$KV_GB" --max-batch-tokens 1024 --max-running 256 \
    >"$OUT_DIR/sim-$fit.jsonl"
done

# Real speedups two ways: the ratio of the medians, and the mean of the ratios within each rep
# (runs next to each other share the machine's state) with its standard error, which says how
# finely these runs resolve a speedup at all.
python3 - "$OUT_DIR" "$REPS" $POLICIES <<'PYEOF'
import json, statistics, sys
out, reps, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
runs = {p: [json.load(open(f"{out}/real-{p}-{r}.json"))["throughput_tokens_per_s"]
            for r in range(1, reps + 1)] for p in policies}
real = {p: statistics.median(runs[p]) for p in policies}
base = policies[0]
paired = {p: [a / b for a, b in zip(runs[p], runs[base])] for p in policies}
for fit in ("isolated", "steps"):
    sim = {json.loads(l)["policy"].split("@")[0]: json.loads(l) for l in open(f"{out}/sim-{fit}.jsonl")}
    print(f"== simulated with the {fit} fit")
    print(f"{'policy':8} {'real tok/s':>11} {'real range':>13} {'sim tok/s':>10} {'sim/real':>9} "
          f"{'real speedup':>13} {'paired (se)':>15} {'sim speedup':>12} {'diff (pts)':>10} {'steps':>6}")
    for p in policies:
        s = sim[p]["throughput_tokens_per_s"]
        rs, ss = real[p] / real[base], s / sim[base]["throughput_tokens_per_s"]
        spread = f"{min(runs[p]):.0f}-{max(runs[p]):.0f}"
        se = statistics.stdev(paired[p]) / len(paired[p]) ** 0.5 if len(paired[p]) > 1 else 0
        pair = f"{statistics.mean(paired[p]):.3f} ({se:.3f})"
        print(f"{p:8} {real[p]:11.1f} {spread:>13} {s:10.1f} {s / real[p]:9.3f} {rs:13.3f} "
              f"{pair:>15} {ss:12.3f} {(ss - rs) * 100:10.2f} {sim[p]['steps']:6d}")
PYEOF
