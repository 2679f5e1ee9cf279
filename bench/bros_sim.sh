#!/usr/bin/env bash
# BROS's online experiment (§7.1) on the simulator at the paper's three testbeds, as in
# docs/BENCHMARKS.md "BROS on the simulator": `blend simulate-serve --duration 600 --json` for
# OPT-13B (tp 2, a100-40g), OPT-30B (tp 4, a100-40g) and Llama-3-70B (tp 8, a100-80g), each at
# its rates, for each RUNS entry (a label and the simulate-serve flags it adds: the default runs
# blend's defaults, "oracle" the cost model's own iteration model without step noise), then one
# markdown table: per testbed, rate and run, hybrid's normalized latency, TTFT attainment and BE
# tokens/s, and fcfs's and prefill-first's (iteration model and noise do not change the
# baselines' decisions; noise changes their step times).
#   OUT_DIR=build/bros bench/bros_sim.sh
# Knobs: BLEND (build/blend), OUT_DIR, POLICIES (hybrid,fcfs,prefill-first), SEED (1), DURATION (600).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BLEND=${BLEND:-$ROOT/build/blend}
OUT_DIR=${OUT_DIR:-$ROOT/build/bros}
mkdir -p "$OUT_DIR"
[[ -x $BLEND ]] || { echo "no blend binary at $BLEND" >&2; exit 1; }
TESTBEDS=(
  "opt-13b|--model-shape opt-13b --tp 2 --hardware a100-40g|2,4,6,8"
  "opt-30b|--model-shape opt-30b --tp 4 --hardware a100-40g|3,6"
  "llama-3-70b|--model-shape llama-3-70b --tp 8 --hardware a100-80g|5,10,15"
)
# RUNS: one "label|flags" a line.
RUNS=${RUNS:-$'default|\noracle|--iteration-model oracle --step-noise 0'}
out=$OUT_DIR/bros.jsonl
: >"$out"
while IFS= read -r run; do
  label=${run%%|*}
  flags=${run#*|}
  for tb in "${TESTBEDS[@]}"; do
    IFS='|' read -r name tbflags rates <<<"$tb"
    # shellcheck disable=SC2086
    "$BLEND" simulate-serve --json --duration "${DURATION:-600}" --seed "${SEED:-1}" \
      --scheduler "${POLICIES:-hybrid,fcfs,prefill-first}" --rt-rate "$rates" $tbflags $flags |
      python3 -c 'import json,sys; [print(json.dumps(dict(json.loads(l), run=sys.argv[1], testbed=sys.argv[2]))) for l in sys.stdin]' \
        "$label" "$name" >>"$out"
  done
done <<<"$RUNS"
python3 - "$out" <<'PY' | tee "$OUT_DIR/bros.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = list(dict.fromkeys(r["run"] for r in rows))
print("| testbed | RT/s | run | hybrid: norm. latency / TTFT attain. / BE tok/s | fcfs | prefill-first |")
print("| --- | --- | --- | --- | --- | --- |")
cell = lambda r: (f"{r['rt_normalized_latency_s']:.4f} / {r['ttft_attainment']:.3f} / "
                  f"{r['be_throughput_tokens_per_s']:,.0f}") if r else "-"
for tb in dict.fromkeys(r["testbed"] for r in rows):
    for rate in dict.fromkeys(r["rt_rate"] for r in rows if r["testbed"] == tb):
        for run in runs:
            get = lambda p: next((r for r in rows if r["testbed"] == tb and r["rt_rate"] == rate
                                  and r["run"] == run and r["policy"] == p), None)
            print(f"| {tb} | {rate:g} | {run} | {cell(get('hybrid'))} | {cell(get('fcfs'))} | "
                  f"{cell(get('prefill-first'))} |")
PY
