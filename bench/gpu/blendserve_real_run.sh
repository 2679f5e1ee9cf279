#!/usr/bin/env bash
# BlendServe on the real engine, and the cost model's data, in one device run (issues 28, 29):
#   1. blend_cuda_tests (run_lib.sh; CUDA_TESTS=0 skips)
#   2. the llama-3-8b folder (throughput.py's, random bf16 weights)
#   3. `blend profile --backend cuda` -> $OUT/profile.json, and the two `blend batch
#      --step-timings` runs of profile_points_run.sh (1,024 x (512 + 128), 512 x (1,024 + 512)),
#      which sim_cross_check.sh refits and cross-predicts on any machine
#   4. a Table 2 trace mix, `blend workload synth --density DENSITY --sharing SHARING --requests
#      REQUESTS --seed 1` (Trace#1 by default: 1.4 / 0.35), its output lengths capped at
#      OUTPUT_CAP tokens so each run ends in well under a minute, run by `blend batch --backend
#      cuda --policy P --hardware $OUT/profile.json` for each P in POLICIES, interleaved ROUNDS
#      times, at each temperature in TEMPERATURES (default: none set, so 1.0); stats and step
#      logs into $OUT
# The GPU's SM clock, power and temperature are sampled every 500 ms into $OUT/clocks.csv. At the
# end everything but the log is packed into $OUT/results.tgz (a device run brings back only a
# few files).
# Everything at --max-batch-tokens 4096 --max-running 512 --kv-memory 59.6. Run from the
# repository root with .gpu/ carried (bench/gpu/bundle.sh); about 330 s on an H100 by default.
# Without a GPU: BLEND=build/blend BACKEND=cpu MODEL=DIR (a folder `blend model init` wrote)
# KV_MEMORY=2 REQUESTS=... runs the same steps on the cpu backend (CUDA_TESTS=0, SKIP_CROSS=1 to
# leave out step 3's batch runs).
set -u
here=bench/gpu
# shellcheck source=bench/gpu/run_lib.sh
. $here/run_lib.sh
TOTAL="${TOTAL:-540}"
run_start blendserve_real
BACKEND="${BACKEND:-cuda}"
REQUESTS="${REQUESTS:-1000}"
OUTPUT_CAP="${OUTPUT_CAP:-512}"
POLICIES="${POLICIES:-blend dfs fcfs random}"
ROUNDS="${ROUNDS:-1}"
TEMPERATURES="${TEMPERATURES:-default}"  # each mix run's temperature ("default": the file's, 1.0)
# MIX_RUNS: "policy:temperature[:ENV=V,...[:--flag,value,...]] ..." to run instead of every
# POLICIES x TEMPERATURES pair (the temperatures must be in TEMPERATURES); the third field sets
# environment knobs for that run (BLEND_CUDA_*), the fourth adds `blend batch` flags ({profile}
# in them names step 3's profile, e.g. "fcfs:default::--dense-batch-sizes,{profile}" for
# discrete batching at the GEMM row tile the profile found).
RUN_TIMEOUT="${RUN_TIMEOUT:-90}"
engine=(--max-batch-tokens 4096 --max-running 512 --kv-memory "${KV_MEMORY:-59.6}")
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv -lms 500 > "$OUT/clocks.csv" 2>&1 &
  clock_pid=$!
  trap 'kill $clock_pid 2>/dev/null' EXIT
fi

run_cuda_tests
if [ -n "${MODEL:-}" ]; then model="$MODEL"; else make_8b_folder; fi

step "blend profile --backend $BACKEND"
timeout -k 5 120 "$BLEND" profile --backend "$BACKEND" --model "$model" --out "$OUT/profile.json" \
  > "$OUT/profile.log" 2>&1
echo "profile: exit $?"
tail -3 "$OUT/profile.log"

batch() {  # NAME INPUT [blend batch flags...]: one timed run, stats and steps into $OUT
  local name="$1" input="$2"
  shift 2
  rm -f /tmp/o.jsonl
  timeout -k 5 "$RUN_TIMEOUT" "$BLEND" batch --backend "$BACKEND" --model "$model" \
    --input "$input" --output /tmp/o.jsonl "${engine[@]}" --quiet \
    --stats "$OUT/stats-$name.json" --step-timings "$OUT/steps-$name.jsonl" "$@"
  local rc=$?
  python3 -c "import json; s=json.load(open('$OUT/stats-$name.json')); \
print('$name exit $rc:', {k: s[k] for k in s if 'per_s' in k or 'seconds' in k or k == 'steps'})" \
    2>/dev/null || echo "$name exit $rc (no stats)"
}

if [ "${SKIP_CROSS:-0}" != 1 ]; then
  for w in 1024:512:128 512:1024:512; do
    IFS=: read -r n p o <<< "$w"
    step "cross-check run $n x ($p + $o)"
    python3 -c "import sys; sys.path.insert(0,'$here'); import throughput as t; \
t.write_workload('/tmp/w-$p-$o.jsonl', $n, $p, $o, 0, 'llama-3-8b')"
    batch "$p-$o" "/tmp/w-$p-$o.jsonl"
  done
fi

step "trace mix: $REQUESTS requests, density ${DENSITY:-1.4}, sharing ${SHARING:-0.35}, outputs <= $OUTPUT_CAP"
"$BLEND" workload synth --density "${DENSITY:-1.4}" --sharing "${SHARING:-0.35}" \
  --requests "$REQUESTS" --seed 1 --traces data/traces --model-shape llama-3-8b \
  --out /tmp/mix-full.jsonl
for t in $TEMPERATURES; do
  python3 - "$OUTPUT_CAP" /tmp/mix-full.jsonl /tmp/mix-t$t.jsonl "$t" << 'EOF'
import json, sys
cap, src, dst, temperature = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
prompt = output = 0
with open(src) as f, open(dst, "w") as g:
    for line in f:
        r = json.loads(line)
        r["body"]["max_tokens"] = min(r["body"]["max_tokens"], cap)
        if temperature != "default":
            r["body"]["temperature"] = float(temperature)
        prompt += len(r["body"]["prompt"])
        output += r["body"]["max_tokens"]
        g.write(json.dumps(r, separators=(",", ":")) + "\n")
print(f"mix: {prompt} prompt tokens, {output} output tokens (capped at {cap}), temperature {temperature}")
EOF
done
if [ -z "${MIX_RUNS:-}" ]; then  # policy:temperature pairs; default: every pair
  for t in $TEMPERATURES; do for policy in $POLICIES; do MIX_RUNS+=" $policy:$t"; done; done
fi
for round in $(seq "$ROUNDS"); do
  for run in $MIX_RUNS; do
    # policy:temperature[:ENV=V,ENV=V[:--flag,value,...]], e.g.
    # "dfs:0:BLEND_CUDA_DECODE_SPLITS=waves" or "blend:0::--pacing-without,budget"
    IFS=: read -r policy t envs flags <<< "$run"
    tag=$(echo "${envs}${flags}" | tr -c 'A-Za-z0-9\n' '_' | tr -s _)
    step "round $round: --policy $policy, temperature $t ${envs:+($envs) }${flags:+(${flags//,/ }) }($(left) s left)"
    [ "$(left)" -lt 40 ] && { echo "out of time"; break 2; }
    (  # a subshell: the knobs end with the run
      for kv in ${envs//,/ }; do export "${kv?}"; done
      # shellcheck disable=SC2046  # the flags split on purpose
      batch "mix-$policy-t$t${tag:+-$tag}-$round" /tmp/mix-t$t.jsonl --policy "$policy" \
        --hardware "$OUT/profile.json" $(echo "$flags" | tr ',' ' ' | sed "s|{profile}|$OUT/profile.json|g")
    )
  done
done
step "done"
# A run's files come back only a few at a time: everything but the log goes into one archive.
rm -rf "$OUT/init"
[ -n "${clock_pid:-}" ] && kill "$clock_pid" 2> /dev/null
(cd "$OUT" && tar czf results.tgz --exclude results.tgz --exclude blendserve_real.log . &&
  find . -type f ! -name results.tgz ! -name blendserve_real.log -delete)
ls -la "$OUT"
