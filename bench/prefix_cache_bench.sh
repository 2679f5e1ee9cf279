#!/usr/bin/env bash
# Throughput of `blend batch` with the prefix cache on and off, on a workload whose prompts share
# a given fraction of their tokens (the papers' "high sharing" case is 35%).
#
#   bench/prefix_cache_bench.sh MODEL_DIR
#
# The workload: N_GROUPS groups of GROUP_SIZE requests; the requests of a group share a prefix
# (a "system prompt") and then have a distinct suffix, PROMPT tokens in all, OUTPUT generated
# tokens each (ignore_eos, greedy). The shared length is chosen so that the optimal sharing ratio
# (every shared prefix computed once) is SHARING. Requests are written in DFS order (group by
# group), as the planner would order them. The runs alternate on/off REPS times; the medians and
# their ratio are printed, with the engine's own sharing_ratio / sharing_optimal.
# Knobs (environment): BLEND (build/blend), OUT_DIR (build/prefix_cache_bench), N_GROUPS (16),
# GROUP_SIZE (16), PROMPT (256), OUTPUT (64), SHARING (0.35), REPS (3), THREADS (2),
# BLEND_BATCH_ARGS (extra flags), REQUESTS (an existing Batch file to run instead of the
# generated workload, e.g. one from bench/mmlu_requests.py).
set -euo pipefail

[[ $# -eq 1 ]] || {
  echo "usage: $0 MODEL_DIR" >&2
  exit 1
}
MODEL=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BLEND=${BLEND:-$ROOT/build/blend}
OUT_DIR=${OUT_DIR:-$ROOT/build/prefix_cache_bench}
N_GROUPS=${N_GROUPS:-16}
GROUP_SIZE=${GROUP_SIZE:-16}
PROMPT=${PROMPT:-256}
OUTPUT=${OUTPUT:-64}
SHARING=${SHARING:-0.35}
REPS=${REPS:-3}
THREADS=${THREADS:-2}
mkdir -p "$OUT_DIR"

REQUESTS=${REQUESTS:-}
if [[ -n "$REQUESTS" ]]; then
  cp "$REQUESTS" "$OUT_DIR/requests.jsonl"
else
python3 - "$OUT_DIR/requests.jsonl" "$N_GROUPS" "$GROUP_SIZE" "$PROMPT" "$OUTPUT" "$SHARING" <<'EOF'
import json, random, sys
path, groups, size, prompt, output, sharing = sys.argv[1], *map(int, sys.argv[2:6]), float(sys.argv[6])
# In a group of `size`, all but the first request reuse the shared prefix: s = (size-1)/size * P/L.
shared = round(sharing * prompt * size / (size - 1))
rng = random.Random(0)
with open(path, "w") as f:
    for g in range(groups):
        prefix = [1000 + g] + [rng.randrange(100, 120000) for _ in range(shared - 1)]
        for i in range(size):
            suffix = [rng.randrange(100, 120000) for _ in range(prompt - shared)]
            body = {"model": "bench", "prompt": prefix + suffix, "max_tokens": output,
                    "ignore_eos": True, "temperature": 0}
            f.write(json.dumps({"custom_id": f"g{g}-{i}", "method": "POST",
                                "url": "/v1/completions", "body": body}) + "\n")
EOF
fi

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), threads=$THREADS"
if [[ -n "$REQUESTS" ]]; then
  echo "== workload: $REQUESTS ($(wc -l <"$REQUESTS") requests)"
else
  echo "== workload: $N_GROUPS x $GROUP_SIZE requests, prompt $PROMPT, output $OUTPUT, sharing $SHARING"
fi
read -r -a extra <<<"${BLEND_BATCH_ARGS:-}"
for rep in $(seq 1 "$REPS"); do
  for cache in on off; do
    rm -f "$OUT_DIR/out-$cache.jsonl"
    "$BLEND" batch --model "$MODEL" --input "$OUT_DIR/requests.jsonl" \
      --output "$OUT_DIR/out-$cache.jsonl" --stats "$OUT_DIR/stats-$cache-$rep.json" \
      --threads "$THREADS" --prefix-cache "$cache" --quiet "${extra[@]}"
  done
done

python3 - "$OUT_DIR" "$REPS" <<'EOF'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def load(cache):
    return [json.load(open(f"{out}/stats-{cache}-{r}.json")) for r in range(1, reps + 1)]
on, off = load("on"), load("off")
t_on = statistics.median(s["throughput_tokens_per_s"] for s in on)
t_off = statistics.median(s["throughput_tokens_per_s"] for s in off)
print(f"cache on : {t_on:8.1f} tokens/s (runs: {', '.join('%.1f' % s['throughput_tokens_per_s'] for s in on)})")
print(f"cache off: {t_off:8.1f} tokens/s (runs: {', '.join('%.1f' % s['throughput_tokens_per_s'] for s in off)})")
print(f"on / off = {t_on / t_off:.3f}")
print(f"sharing_ratio {on[0]['sharing_ratio']:.4f}, sharing_optimal {on[0]['sharing_optimal']:.4f}, "
      f"achieved/optimal {on[0]['sharing_ratio'] / on[0]['sharing_optimal']:.4f}")
EOF
