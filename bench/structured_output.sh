#!/usr/bin/env bash
# What structured output (response_format json_schema, issue 32) costs `blend batch`, and how
# often its outputs are valid.
#
#   bench/structured_output.sh      # tiny preset, batches of 64 and 256 requests
#
# Throughput: BATCHES (64 256) chat requests, request i constrained by schema i mod 8 of
# tests/grammar/data/schemas.json (nested objects, arrays, enums, required/optional, numbers,
# strings with escapes, anyOf, $ref), temperature 1, seed i, max_tokens TG. The unconstrained
# run sends the same requests without response_format and with max_tokens = the number of
# tokens the constrained run generated for that request (ignore_eos), so both runs compute the
# same tokens and differ only by the grammar work (compiling, masks, matching). Constrained and
# unconstrained runs alternate REPS times (a neighbour's load falls on both); each is a fresh
# process, so grammar compilation and cold masks are counted. Prints median output tokens/s and
# the ratio.
# Validity: VALID_N requests over the same schemas with max_tokens 2000 (every output must
# complete: finish_reason "stop"), each output checked by python3-jsonschema
# (tests/grammar/validate_json.py).
# Knobs (environment): BLEND (build/blend), MODELS_DIR (build/bench_models), OUT_DIR
# (build/structured_output), PRESET (tiny), DTYPE (bf16), BATCHES ("64 256"), TG (128), REPS (3),
# VALID_N (64), THREADS (0: all cores).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BLEND=${BLEND:-$ROOT/build/blend}
MODELS_DIR=${MODELS_DIR:-$ROOT/build/bench_models}
OUT_DIR=${OUT_DIR:-$ROOT/build/structured_output}
PRESET=${PRESET:-tiny}
DTYPE=${DTYPE:-bf16}
BATCHES=${BATCHES:-64 256}
TG=${TG:-128}
REPS=${REPS:-3}
VALID_N=${VALID_N:-64}
THREADS=${THREADS:-0}
SCHEMAS=$ROOT/tests/grammar/data/schemas.json
need_blend_and_python
check_reps
python3 -c 'import jsonschema' 2>/dev/null || die "python3-jsonschema is required (scripts/setup.sh)"
mkdir -p "$OUT_DIR" "$MODELS_DIR"
model=$MODELS_DIR/$PRESET-$DTYPE
if [[ ! -f "$model/config.json" ]]; then
  "$BLEND" model init --preset "$PRESET" --dtype "$DTYPE" --out "$model" >/dev/null ||
    die "blend model init --preset $PRESET --dtype $DTYPE failed"
fi
echo "== machine: $(cpu_model), $(nproc) cores," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg); $PRESET $DTYPE TG=$TG REPS=$REPS"

# write_lines FILE N MAX_TOKENS [COUNTS_FROM]: N chat lines, schema i mod 8; with COUNTS_FROM
# (a results file of the constrained run) the lines carry no schema and ask for exactly the
# tokens that run generated.
write_lines() {
  python3 - "$SCHEMAS" "$@" <<'PY'
import json, sys
schemas = json.load(open(sys.argv[1]))
path, n, max_tokens = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
counts = None
if len(sys.argv) > 5:
    counts = {}
    for line in open(sys.argv[5]):
        r = json.loads(line)
        counts[r["custom_id"]] = r["response"]["body"]["usage"]["completion_tokens"]
with open(path, "w") as f:
    for i in range(n):
        cid = f"req-{i}"
        body = {"model": "bench", "temperature": 1, "seed": i,
                "messages": [{"role": "user", "content": f"Request {i}: answer in JSON."}]}
        if counts is None:
            body["max_tokens"] = max_tokens
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": f"s{i % len(schemas)}", "schema": schemas[i % len(schemas)], "strict": True}}
        else:
            body["max_tokens"] = max(1, counts[cid])
            body["ignore_eos"] = True
        f.write(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                            "body": body}) + "\n")
PY
}

for b in $BATCHES; do
  write_lines "$OUT_DIR/schema-$b.jsonl" "$b" "$TG"
  req=$OUT_DIR/schema-$b.jsonl
  run_batch "$model" "schema-$b-warm" output_tokens >/dev/null --threads "$THREADS"
  write_lines "$OUT_DIR/plain-$b.jsonl" "$b" "$TG" "$OUT_DIR/out-schema-$b-warm.jsonl"
  for ((i = 0; i < REPS; i++)); do
    req=$OUT_DIR/schema-$b.jsonl
    run_batch "$model" "schema-$b-$i" output_tokens_per_s --threads "$THREADS" >/dev/null
    req=$OUT_DIR/plain-$b.jsonl
    run_batch "$model" "plain-$b-$i" output_tokens_per_s --threads "$THREADS" >/dev/null
  done
done

# Validity: long enough for every output to complete.
write_lines "$OUT_DIR/valid.jsonl" "$VALID_N" 2000
req=$OUT_DIR/valid.jsonl
run_batch "$model" valid output_tokens --threads "$THREADS" >/dev/null

python3 - "$OUT_DIR" "$REPS" "$BATCHES" "$SCHEMAS" <<'PY'
import json, statistics, sys
out, reps, batches, schemas_path = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
for b in batches:
    med = {}
    for kind in ("plain", "schema"):
        stats = [json.load(open(f"{out}/stats-{kind}-{b}-{i}.json")) for i in range(reps)]
        tps = [st["output_tokens_per_s"] for st in stats]
        # The engine thread's own seconds (planning, masks, matching, detokenizing) beside the
        # backend's (forward pass and sampling).
        host = statistics.median(st["step_seconds"] - st["backend_seconds"] for st in stats)
        backend = statistics.median(st["backend_seconds"] for st in stats)
        med[kind] = statistics.median(tps)
        print(f"batch {b:>4} {kind:>6}: output tok/s " + " ".join(f"{x:8.1f}" for x in tps) +
              f"  median {med[kind]:8.1f}  ({stats[0]['output_tokens']} output tokens;"
              f" engine thread {host:.2f} s, backend {backend:.2f} s)")
    print(f"batch {b:>4} schema / plain: {med['schema'] / med['plain']:.3f}")
schemas = json.load(open(schemas_path))
cases, stops = [], 0
lines = [json.loads(l) for l in open(f"{out}/valid.jsonl")]
body_of = {l["custom_id"]: l["body"] for l in lines}
for line in open(f"{out}/out-valid.jsonl"):
    r = json.loads(line)
    choice = r["response"]["body"]["choices"][0]
    stops += choice["finish_reason"] == "stop"
    schema = body_of[r["custom_id"]]["response_format"]["json_schema"]["schema"]
    cases.append({"schema": schema, "text": choice["message"]["content"]})
json.dump(cases, open(f"{out}/valid-cases.json", "w"))
print(f"validity: {len(cases)} outputs, {stops} finished with stop; python3-jsonschema:")
PY
python3 "$ROOT/tests/grammar/validate_json.py" "$OUT_DIR/valid-cases.json"
