#!/usr/bin/env bash
# The cost model on the GPU (issue 28): `blend profile --backend $backend` fits the hardware profile
# on the llama-3-8b folder's isolated steps, `blend batch --backend $backend` runs a Batch file for
# real (with --step-timings), `blend simulate --hardware` that profile predicts the same file,
# and `blend profile --steps` refits on the real run's steps; then the same batch with
# --overlap-schedule on (NanoFlow §5.3's asynchronous scheduling on the GPU). Runs on the lent
# GPU machine after bench/gpu/unpack.sh, each step under a timeout, everything in $OUT:
#   OUT=DIR bash bench/gpu/profile_check.sh [REQUESTS (1024)] [PROMPT (512)] [OUTPUT (128)]
# Here, to check the script: BLEND=build/blend BACKEND=cpu MODEL_DIR=/tmp/tiny KV_GB=0.5 ...
set -u
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/profile_check.log") 2>&1
here="$(cd "$(dirname "$0")" && pwd)"
n="${1:-1024}" prompt="${2:-512}" output="${3:-128}"
B="${BLEND:-/tmp/blend/bin/blend}"
M="${MODEL_DIR:-/tmp/blend-throughput/model}"
backend="${BACKEND:-cuda}"
W=/tmp/blend-profile-check
mkdir -p "$W"
start=$(date +%s)
step() { echo; echo "=== [$(($(date +%s) - start)) s] $*"; }
budget=4096 running=512 kv="${KV_GB:-118.4}"

[ -x "$B" ] || bash "$here/unpack.sh" .gpu/blend-bundle.tar.xz /tmp/blend
if [ ! -f "$M/config.json" ]; then
  step "model init llama-3-8b"
  timeout 120 "$B" model init --preset llama-3-8b --allow-large --out "$M" | tail -1
fi
step "workload: $n x ($prompt + $output) random token ids, ignore_eos"
python3 -c "import sys; sys.path.insert(0, '$here'); import throughput as t; \
t.write_workload('$W/w.jsonl', $n, $prompt, $output, 0, 'llama-3-8b')" || exit 1

step "blend profile --backend $backend"
timeout 90 "$B" profile --backend $backend --model "$M" --out "$OUT/h200-profile.json"
echo "profile: exit $?"

step "blend batch --backend $backend --max-batch-tokens $budget --step-timings"
rm -f "$W/o.jsonl"
timeout 60 "$B" batch --backend $backend --model "$M" --input "$W/w.jsonl" --output "$W/o.jsonl" \
  --max-batch-tokens $budget --max-running $running --kv-memory "$kv" --quiet \
  --stats "$OUT/batch-stats.json" --step-timings "$W/steps.jsonl"
echo "batch: exit $?"
python3 -c "import json; s = json.load(open('$OUT/batch-stats.json')); \
print({k: s[k] for k in s if 'per_s' in k or 'seconds' in k or k == 'steps'})"

simulate() {  # simulate PROFILE: the same file, budget, running and KV on the simulator
  step "blend simulate --hardware $1.json (sequential, as the cuda engine runs; and overlapped)"
  timeout 30 "$B" simulate --workload "$W/w.jsonl" --hardware "$OUT/$1.json" --model "$M" \
    --policy fcfs@sequential,fcfs --max-batch-tokens $budget --max-running $running \
    --kv-memory "$kv" --json | tee "$OUT/simulate-$1.jsonl"
}
simulate h200-profile

step "blend batch --backend $backend --overlap-schedule on"
rm -f "$W/o2.jsonl"
timeout 60 "$B" batch --backend $backend --model "$M" --input "$W/w.jsonl" --output "$W/o2.jsonl" \
  --max-batch-tokens $budget --max-running $running --kv-memory "$kv" --quiet \
  --overlap-schedule on --stats "$OUT/batch-stats-overlap.json"
echo "batch overlap: exit $?"

step "blend profile --backend $backend --steps (refit on the real run's steps)"
timeout 90 "$B" profile --backend $backend --model "$M" --steps "$W/steps.jsonl" \
  --out "$OUT/h200-steps-profile.json"
echo "profile --steps: exit $?"
simulate h200-steps-profile

step "done"
