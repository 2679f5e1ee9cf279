#!/usr/bin/env bash
# Does the simulator predict this machine? Profiles the cpu backend (`blend profile`), runs the
# same workload through `blend batch --policy P` for real (REPS times, median) and through
# `blend simulate --policy P@sequential` with the profile, and prints both throughputs, their
# ratio, and each policy's speedup over dfs measured vs simulated (issue 8: within 5% and 2
# points).
#
#   bench/sim_validation.sh MODEL_DIR [WORKLOAD.jsonl]
#
# The workload must use token-id prompts with ignore_eos and max_tokens (the simulator's true
# output lengths). Without one, a mixed workload is generated: 96 requests, half compute-heavy
# (300-700 prompt tokens, 6-15 output), half memory-heavy (20-60 prompt, 120-260 output), on
# three shared prefixes of 64-160 tokens, shuffled. Knobs: BLEND (build/blend), OUT_DIR (build/sim_validation), POLICIES
# ("dfs blend random"), REPS (3), THREADS (2), KV_GB (0.5).
set -euo pipefail
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 MODEL_DIR [WORKLOAD.jsonl]" >&2; exit 1; }
MODEL=$1
WORKLOAD=${2:-}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BLEND=${BLEND:-$ROOT/build/blend}
OUT_DIR=${OUT_DIR:-$ROOT/build/sim_validation}
POLICIES=${POLICIES:-"dfs blend random"}
REPS=${REPS:-3}
THREADS=${THREADS:-2}
KV_GB=${KV_GB:-0.5}
mkdir -p "$OUT_DIR"
if [[ -z "$WORKLOAD" ]]; then
  WORKLOAD=$OUT_DIR/workload.jsonl
  python3 - "$WORKLOAD" <<'GEN'
import json, random, sys
rng = random.Random(7)
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
with open(sys.argv[1], "w") as f:
    for r in reqs:
        f.write(json.dumps(r) + "\n")
GEN
fi

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), threads=$THREADS"
"$BLEND" profile --model "$MODEL" --out "$OUT_DIR/profile.json" --threads "$THREADS" --reps 5 |
  tail -1
for rep in $(seq 1 "$REPS"); do
  for p in $POLICIES; do
    rm -f "$OUT_DIR/out-$p.jsonl"
    "$BLEND" batch --model "$MODEL" --input "$WORKLOAD" --output "$OUT_DIR/out-$p.jsonl" \
      --stats "$OUT_DIR/real-$p-$rep.json" --threads "$THREADS" --kv-memory "$KV_GB" \
      --policy "$p" --hardware "$OUT_DIR/profile.json" --quiet
  done
done
sim_list=$(for p in $POLICIES; do printf '%s@sequential,' "$p"; done)
"$BLEND" simulate --json --model "$MODEL" --hardware "$OUT_DIR/profile.json" --workload "$WORKLOAD" \
  --policy "${sim_list%,}" --kv-memory "$KV_GB" --max-batch-tokens 1024 --max-running 256 \
  >"$OUT_DIR/sim.jsonl"

python3 - "$OUT_DIR" "$REPS" $POLICIES <<'PYEOF'
import json, statistics, sys
out, reps, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
sim = {json.loads(l)["policy"].split("@")[0]: json.loads(l) for l in open(f"{out}/sim.jsonl")}
real = {p: statistics.median(json.load(open(f"{out}/real-{p}-{r}.json"))["throughput_tokens_per_s"]
                             for r in range(1, reps + 1)) for p in policies}
base = policies[0]
print(f"{'policy':8} {'real tok/s':>11} {'sim tok/s':>10} {'sim/real':>9} "
      f"{'real speedup':>13} {'sim speedup':>12} {'diff (pts)':>10} {'steps':>6}")
for p in policies:
    s = sim[p]["throughput_tokens_per_s"]
    rs, ss = real[p] / real[base], s / sim[base]["throughput_tokens_per_s"]
    print(f"{p:8} {real[p]:11.1f} {s:10.1f} {s / real[p]:9.3f} {rs:13.3f} {ss:12.3f} "
          f"{(ss - rs) * 100:10.2f} {sim[p]['steps']:6d}")
PYEOF
