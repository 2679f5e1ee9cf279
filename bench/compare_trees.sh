#!/usr/bin/env bash
# Runs one fixed set of commands with two `blend` binaries (two trees: before and after a
# refactor) and compares what they print and write. A refactor that must change no result
# (issue 24) passes only when every `--deterministic` token and logprob and every simulated
# figure is identical.
#
#   bench/compare_trees.sh OLD_BLEND NEW_BLEND [WORK_DIR]
#
# What runs (each with both binaries, same inputs):
#   - `blend batch --deterministic` on a tiny generated model: 48 completion and chat requests
#     mixing greedy, seeded temperature, top-k/top-p/min-p, logprobs, stop strings, shared
#     prefixes; with the default policy and with --policy blend, and once with a KV cache small
#     enough to force preemption;
#   - `blend simulate` on a 2,000-request synthesized workload, all five policies, --json;
#   - `blend simulate` with 5% output-length sampling (hidden lengths), and with --dp 3;
#   - `blend simulate-serve` (hybrid, fcfs, round-robin, prefill-first; 2 rates; 120 s), --json;
#   - `blend plan --explain`.
# Fields that differ between any two runs by nature (response ids, creation times, wall-clock
# seconds and rates) are dropped before comparing. Exit status 0 = identical.
# Knobs (environment): TRACES (default data/traces in the repository); NEW_BATCH_ARGS, flags
# only the new binary's `blend batch` runs get (e.g. "--overlap-schedule on": a mode that must
# not change the tokens either).
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 OLD_BLEND NEW_BLEND [WORK_DIR]" >&2; exit 2; }
OLD=$(realpath "$1")
NEW=$(realpath "$2")
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${3:-$(mktemp -d)}
TRACES=${TRACES:-$ROOT/data/traces}
mkdir -p "$WORK"
cd "$WORK"

"$NEW" model init --preset tiny --out model --seed 7 >/dev/null
python3 - <<'PY'
import json
lines = []
shared = "You are a careful assistant. Answer in one short sentence. " * 3
for i in range(48):
    kind = i % 6
    body = {"model": "model", "max_tokens": 12 + i % 9}
    if kind == 0:
        body["temperature"] = 0
    elif kind == 1:
        body.update(temperature=0.8, seed=1000 + i)
    elif kind == 2:
        body.update(temperature=1.0, top_k=20, top_p=0.9, seed=i)
    elif kind == 3:
        body.update(temperature=0.7, min_p=0.05, logprobs=True, top_logprobs=3, seed=i)
    elif kind == 4:
        body.update(temperature=0, stop=["e", "the"])
    else:
        body.update(temperature=1.2, seed=7 * i, logprobs=True, top_logprobs=2)
    if i % 2:
        url = "/v1/chat/completions"
        body["messages"] = [{"role": "system", "content": shared},
                            {"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]
        if kind == 3 or kind == 5:
            body.pop("logprobs"); body.pop("top_logprobs")
            body["logprobs"] = True
            body["top_logprobs"] = 2
    else:
        url = "/v1/completions"
        body["prompt"] = shared + f"Item {i}:"
        if "top_logprobs" in body:
            n = body.pop("top_logprobs"); body.pop("logprobs"); body["logprobs"] = n
    lines.append({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body})
with open("requests.jsonl", "w") as f:
    for l in lines:
        f.write(json.dumps(l) + "\n")
PY

"$NEW" workload synth --density 1.2 --sharing 0.3 --requests 2000 --seed 5 --traces "$TRACES" \
  --out workload.jsonl >/dev/null

run_both() {  # NAME CMD... (the binary is BLEND, new-only flags EXTRA; outputs NAME.old / .new)
  local name=$1
  shift
  for side in old new; do
    local bin=$OLD extra=""
    [[ $side == new ]] && bin=$NEW extra=${NEW_BATCH_ARGS:-}
    rm -f "$name.$side.out"
    (BLEND=$bin; EXTRA=$extra; OUTFILE=$name.$side.out; eval "$@") >"$name.$side.stdout" 2>"$name.$side.stderr" ||
      { echo "$name ($side) failed:" >&2; tail -5 "$name.$side.stderr" >&2; return 1; }
  done
}

# The scheduler flag of a binary: --scheduler, or --policy before session 44 renamed it there.
scheduler_flag() { "$1" simulate-serve --help 2>/dev/null | grep -q -- '--scheduler' && echo --scheduler || echo --policy; }

run_both batch '$BLEND batch --model model --input requests.jsonl --output $OUTFILE --deterministic --threads 2 $EXTRA'
run_both batch_blend '$BLEND batch --model model --input requests.jsonl --output $OUTFILE --deterministic --threads 2 --policy blend $EXTRA'
run_both batch_preempt '$BLEND batch --model model --input requests.jsonl --output $OUTFILE --deterministic --threads 2 --kv-memory 0.0004 --max-batch-tokens 64 $EXTRA'
run_both simulate '$BLEND simulate --workload workload.jsonl --policy blend,dfs,dfs@sequential,random,fcfs --json'
run_both simulate_sampled '$BLEND simulate --workload workload.jsonl --policy blend,dfs --sample-fraction 0.05 --json'
run_both simulate_dp '$BLEND simulate --workload workload.jsonl --policy blend,dfs --dp 3 --json'
run_both simulate_serve '$BLEND simulate-serve $(scheduler_flag $BLEND) hybrid,fcfs,round-robin,prefill-first --rt-rate 1,3 --duration 120 --be-batch 256 --traces "$TRACES" --json'
run_both plan '$BLEND plan --input workload.jsonl --model-shape llama-3-8b --hardware a100-80g --explain'

python3 - "$WORK" <<'PY'
import json, sys, os, re
work = sys.argv[1]
VOLATILE = re.compile(r"^(id|request_id|created|.*seconds.*|.*_s|.*per_s.*|.*wall.*|throughput_tokens_per_s|elapsed.*|system_fingerprint)$")

def scrub(x):
    if isinstance(x, dict):
        return {k: scrub(v) for k, v in x.items() if not VOLATILE.match(k)}
    if isinstance(x, list):
        return [scrub(v) for v in x]
    return x

def load_jsonl(path, key=None):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(scrub(json.loads(line)))
            except json.JSONDecodeError:
                out.append(line)
    if key:
        out.sort(key=lambda o: o.get(key, "") if isinstance(o, dict) else str(o))
    return out

failed = 0
checks = [("batch", "out", "custom_id"), ("batch_blend", "out", "custom_id"),
          ("batch_preempt", "out", "custom_id"), ("simulate", "stdout", None),
          ("simulate_sampled", "stdout", None), ("simulate_dp", "stdout", None),
          ("simulate_serve", "stdout", None),
          ("plan", "stdout", None)]
for name, ext, key in checks:
    old = load_jsonl(os.path.join(work, f"{name}.old.{ext}"), key)
    new = load_jsonl(os.path.join(work, f"{name}.new.{ext}"), key)
    if old == new:
        print(f"identical  {name}: {len(old)} lines")
        continue
    failed += 1
    print(f"DIFFERENT  {name}: {len(old)} vs {len(new)} lines")
    for a, b in zip(old, new):
        if a != b:
            print("  old:", json.dumps(a)[:400])
            print("  new:", json.dumps(b)[:400])
            break
print(f"{len(checks) - failed} identical, {failed} different (work dir {work})")
sys.exit(1 if failed else 0)
PY
