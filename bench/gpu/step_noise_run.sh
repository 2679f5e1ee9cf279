#!/usr/bin/env bash
# Step-time logs of real cuda runs, for the simulator's --step-noise (issue 27: the figure used so
# far, 0.105, was measured on the CPU). On the lent GPU machine, from the repository root with
# .gpu/ carried: unpack, the llama-3-8b folder, then `blend batch --backend cuda --step-timings`
# on each STEP_WORK item (requests:prompt:output:max_running, random prompt ids, ignore_eos) ->
# $OUT/steps-<item>.jsonl and $OUT/stats-<item>.json. bench/step_noise.py reads them here.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/run_lib.sh"
run_start step_noise_run
make_8b_folder
B=$BLEND
M=$model
W=/tmp/blend-step-noise
mkdir -p "$W"
for item in ${STEP_WORK:-64:16:256:64 1024:512:128:512}; do
  IFS=: read -r n prompt output running <<<"$item"
  tag=$(echo "$item" | tr : -)
  python3 -c "import sys; sys.path.insert(0, '$here'); import throughput as t; \
t.write_workload('$W/w-$tag.jsonl', $n, $prompt, $output, 0, 'llama-3-8b')" || continue
  echo "=== blend batch $item"
  timeout -k 5 120 "$B" batch --backend cuda --model "$M" --input "$W/w-$tag.jsonl" \
    --output "$W/o-$tag.jsonl" --max-batch-tokens 4096 --max-running "$running" \
    --kv-memory "${KV_GB:-50}" --quiet --stats "$OUT/stats-$tag.json" \
    --step-timings "$OUT/steps-$tag.jsonl"
  echo "batch $item: exit $?"
done
ls -la "$OUT"
